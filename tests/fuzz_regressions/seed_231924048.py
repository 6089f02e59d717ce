# Found by scripts/fuzz.py (seed 231924048, dispatch host), silently wrong since views were first
# checked on the dispatch host: a region split twice (a data-dependent guard, then again) checked
# its piece `w = v[:, 1:]` against the names of that piece's part only, so `a` (which is `v`)
# looked unbound and `w` untracked; `a[0, 1] = h[1, 1]` then missed `w` (output 5). A piece sees
# the names its region's earlier parts computed (DispatchHost._run_parts).
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        if (h > 0).sum() > 5:
            return h * 2.0
        if h.abs().max().item() > 1.5:
            h = torch.relu(h) - 0.1
            h = h - h.mean() * 0.5
        else:
            h = self.lin(h)
        return h


class Fuzzed(nn.Module):
    def __init__(self):
        super().__init__()
        self.l0 = nn.Linear(6, 6)
        self.l1 = nn.Linear(6, 6)
        self.l2 = nn.Linear(6, 6)
        self.sub = Sub()

    def forward(self, h):
        v = h * 0.5
        a = v
        s = 0
        cnt = torch.zeros((), dtype=torch.long)
        outs = []
        w = v[:, 1:]
        seq = h[:, :1] * 1.0
        toks = []
        spare = []
        sel = (h[1] < -0.3).nonzero(as_tuple=True)[0]
        if sel.numel() == 0: cnt = cnt + 1
        toks.append(int((h > -0.3).sum()))
        h = h * 1.5
        a[0, 1] = h[1, 1]
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a, w * 1.0, seq * 1.0, len(toks), sum(toks), len(spare)
