# Found by scripts/fuzz.py (seed 637639992), on the dispatch host: `a = v`, then a static `for`
# inside the `else` of a tensor `if` (a staged island) updates `a[0, 1]`, and `v` is read after
# it; the island returned the update under `a` only, so `torch.sigmoid(h) * v` used the old `v`
# (torch's answer differed by 0.0855, silently). An island now also returns the names read later
# that may hold a tensor it updates in place (rewrite/converters/dispatch_split.py).
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        h = torch.relu(h) - 0.1
        if h.abs().max().item() > 2.0:
            h = h * -0.25
        elif h[0, 1] > 2.0:
            h = h - h.mean() * 0.5
            h = h * -0.25
        elif h.sum() > 1.0:
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
        if h.half().sum() > 2.0:
            n1 = torch.zeros((), dtype=torch.long)
            while cnt > 0 and n1 < 1:
                n1 = n1 + 1
                h = self.l2(h)
                h = h * 0.9 + 0.05
        else:
            for _ in range(1):
                a[0, 1] = h[1, 1]
                h = h + v
            s += 1
        if h.sum() > -0.5:
            for _ in range(3):
                outs.append(h.sum())
        else:
            v = torch.relu(h) - 0.1
            cnt = (h.argmax() * 3 + cnt) % 1009
        h = torch.sigmoid(h) * v
        if h.sum() > -0.5:
            h = h - h.mean() * 0.5
            n2 = torch.zeros((), dtype=torch.long)
            while h.mean() < -0.5 and n2 < 2:
                n2 = n2 + 1
                v = self.l1(h)
                v = self.l0(v) * 0.5 + h
                h = h * 0.9 + 0.05
        a[0, 3] = h[1, 3]
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a

