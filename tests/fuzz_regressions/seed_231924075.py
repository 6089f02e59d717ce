# Found by scripts/fuzz.py (seed 231924075, dispatch host) while views were first kept across
# programs: an island (the inner elif chain) took `a`, the root of `w = v[0]`, and returned `a` as a
# new array on the path that keeps it, outside `w`'s family; `a.mul_(0.5)` then missed `w`
# (output 5). An island given an array of a view's family runs its host version.
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        h = torch.relu(h) - 0.1
        h = torch.tanh(h)
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
        w = v[0]
        spare = []
        if h.mean() < 2.0:
            a.mul_(0.5)
        elif cnt > 0 or h.abs().max().item() > 0.5:
            if h.mean() < 0.0:
                h = h - h.mean() * 0.5
                a = v[:, :]
            elif cnt > 0:
                h = torch.relu(h) - 0.1
            else:
                cnt = cnt + 1
        a.mul_(0.5)
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a, w * 1.0, len(spare)
