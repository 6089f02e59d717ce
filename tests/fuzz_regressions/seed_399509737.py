# Found by scripts/fuzz.py (seed 399509737): `hh` assigned only under `if s > 0:` (never taken: s is
# 0) inside a host loop after a tensor `while` that appends to a list. The dispatch host waited on
# a captured part's outputs with jax.block_until_ready, which read an attribute of the unassigned
# `hh` (an Undefined): UnboundLocalError, our crash, on every input. It now waits on arrays only.
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        if (h > 0).sum() > 6:
            h = h - h.mean() * 0.5
            h = self.lin(h)
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
        n1 = torch.zeros((), dtype=torch.long)
        while v.sum() < 1.0 and n1 < 4:
            n1 = n1 + 1
            outs.append(h.sum())
            h = h * 0.9 + 0.05
        for j in range(3):
            h = torch.sigmoid(h) * v
            if s > 0:
                h = self.sub(h)
                hh = h.half(); hh = hh * hh.mean() - 0.5; h = hh.float() * 0.5 + h
            elif not s > 1:
                h = self.l1(h)
                h = torch.relu(h) - 0.1
            elif h.mean() < 2.0:
                outs.append(h.sum())
        s += 1
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a

