# Found by scripts/fuzz.py (seed 295209341, dispatch host), refused until views were kept across
# programs: an island (a construct staged whole) updates `a`, a tensor whose view `w` is live.
# An island given an array of a view's family runs its host version (DispatchHost._island); a
# first version ran the island's program, dropped its results and reported its decisions twice.
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        if h.mean() < -0.5:
            return h * 2.0
        if h.mean() < 0.0:
            return h * 2.0
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
        w = v.view(-1)
        xs = [v]
        seq = h[:, :1] * 1.0
        toks = []
        spare = []
        outs.append(h.sum())
        if h.abs().max().item() > 0.5 and h.sum() > 0.0:
            return h * 2.0, s, cnt, len(outs), a, w * 1.0, xs[0] + 0.0, seq * 1.0, len(toks), sum(toks), len(spare)
        if v.sum() < 0.0:
            n1 = torch.zeros((), dtype=torch.long)
            while h.sum() > 0.5 and n1 < 3:
                n1 = n1 + 1
                hh = h.half(); hh = hh * hh.mean() - 0.5; h = hh.float() * 0.5 + h
                if v.sum() < -1.5:
                    continue
                h = h * 0.9 + 0.05
            v.mul_(1.5)
        elif not (h[0] > 0.0).nonzero().numel() > 2:
            outs.append(h.sum())
        s += len([t for t in h[0].tolist() if t > 1.0])
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a, w * 1.0, xs[0] + 0.0, seq * 1.0, len(toks), sum(toks), len(spare)
