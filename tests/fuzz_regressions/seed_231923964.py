# Found by scripts/fuzz.py (seed 231923964, dispatch host), silently wrong since views were first
# checked on the dispatch host: `w = v.transpose(0, 1)` where `a = v` too; `a` is rebound before
# it is read again, so the check took `w`'s base (named by `a`) for dead and missed `v`, which
# holds the same tensor; `a.add_(h)` on the path where `v` is kept then missed `w` (output 5).
# Every output name of the base's tensor is a holder now (host/views.check_views_kept).
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        if h.mean() < 1.0:
            h = torch.tanh(h)
            h = h - h.mean() * 0.5
        h = torch.relu(h) - 0.1
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
        w = v.transpose(0, 1)
        xs = [v]
        spare = []
        if h.sum() > 0.5:
            v = h - h.mean() * 0.5
        else:
            h = torch.relu(h) - 0.1
        a = v[:, :]
        if not h.sum() > -1.5:
            if cnt > 0 or h.sum() > 2.0:
                return h * 2.0, s, cnt, len(outs), a, w * 1.0, xs[0] + 0.0, len(spare)
        else:
            v = a
        a.add_(h)
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a, w * 1.0, xs[0] + 0.0, len(spare)
