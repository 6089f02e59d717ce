# Found by scripts/fuzz.py (seed 241326606, dispatch host): `w = v[:, 1:]` before a static `for`
# whose body updates `v` through `t = a if ... else v; t.mul_(0.5)`. A view's region now counts
# only updates outside it, and the `for`'s iterable temp, located at the whole loop, made the
# body's update look earlier than the region's end: `w` missed it (silently wrong). Refused with
# a located error, as before that change (dispatch_split._updated_after counts from the run's
# first line).
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        if h[0, 2] > 0.0:
            return h * 2.0
        if (h > 0).sum() > 7:
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
        w = v[:, 1:]
        seq = h[:, :1] * 1.0
        toks = []
        spare = []
        h = h - h.mean() * 0.5
        h = h + v
        cnt = (h.argmax() * 1000003 + cnt) % 11
        for j in range(3):
            t = a if h.half().sum() > 0.0 else v; t.mul_(0.5)
            h = h * 2.0
        n1 = torch.zeros((), dtype=torch.long)
        while h.abs().max().item() > 2.0 and n1 < 4:
            n1 = n1 + 1
            n2 = torch.zeros((), dtype=torch.long)
            while (h[0] > 0.5).nonzero().numel() > 3 and n2 < 1:
                n2 = n2 + 1
                if seq.shape[1] > 3: seq = seq[:, 1:]
                h = h * 0.9 + 0.05
            n3 = torch.zeros((), dtype=torch.long)
            while h.half().sum() > -1.5 and n3 < 3:
                n3 = n3 + 1
                (spare if h.mean() < -1.5 else outs).append(h.mean())
                h = torch.sigmoid(h) * v
                h = h * 0.9 + 0.05
            h = h * 0.9 + 0.05
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a, w * 1.0, seq * 1.0, len(toks), sum(toks), len(spare)

