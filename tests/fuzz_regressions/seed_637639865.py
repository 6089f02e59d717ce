# Found by scripts/fuzz.py (seed 637639865), on the dispatch host: `a = v`, then `v.add_(h)` in
# an `if/elif` chain staged as an island inside the `else` of a tensor `if`, and `a` returned at
# the end; the island gave the update to `v` only (silently differing from torch). Fixed as seed
# 637639992: the island returns the updated tensor under `a` too.
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        h = torch.relu(h) - 0.1
        if h[0, 5] > 0.0:
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
        if s > 2:
            v[:, 5] += 1.0
            h = h * -0.25
        else:
            if h.half().sum() > 2.0 and cnt > 2:
                h = torch.tanh(h)
            else:
                cnt = (h.argmax() * 3 + cnt) % 5
                outs.append(h.sum())
        h = h * 2.0
        outs.append(h.sum())
        h = self.sub(h)
        if v.sum() < 0.0:
            h = torch.sigmoid(h) * v
            n1 = torch.zeros((), dtype=torch.long)
            while h.sum() > -0.5 and n1 < 1:
                n1 = n1 + 1
                h = torch.sigmoid(h) * v
                outs.append(h.sum())
                h = h * 0.9 + 0.05
        else:
            if cnt > 0:
                v.add_(h)
            elif h.half().sum() > 0.0 and s > 2:
                s += 1
            else:
                h = torch.tanh(h)
            s += 1
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a

