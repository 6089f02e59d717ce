# Found by scripts/fuzz.py (seed 220380316), on the dispatch host: `jm(...)` matched torch, but
# the decisions differed: the island of the if/elif chain at `if h[0, 1] > 2.0` staged on the
# host (`v` and `a` were two arrays there, after an earlier staged island returned them apart)
# while the rewritten torch program ran its host version (`v is a` in torch). The host decides
# whether an island's aliased names are one array, and the rewritten torch program replays it.
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        h = torch.relu(h) - 0.1
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
        while h.mean() < -1.5 and n1 < 1:
            n1 = n1 + 1
            h = self.sub(h)
            h = h * 0.9 + 0.05
        h = (h.half() * 0.001).float() * 1000.0
        h = self.sub(h)
        if h.half().sum() > 2.0:
            cnt = (h.argmax() * 3 + cnt) % 5
            cnt = (h.argmax() * 1000003 + cnt) % 5
        else:
            if v.sum() < -1.5 or h.sum() > -1.5:
                cnt = cnt + 1
                s += 1
            elif h.half().sum() > -0.5:
                h = self.l0(h)
                s += 1
            else:
                h = h * 2.0
                v = torch.sigmoid(h) * v
            h = h - h.mean() * 0.5
        if h[0, 5] > 0.5:
            if not h[0, 1] > 2.0:
                h = h + v
            elif h.half().sum() > 2.0:
                v = h + v
                v = self.l0(v) * 0.5 + h
            elif not cnt > 1:
                h = torch.sigmoid(h) * v
            else:
                h = torch.sigmoid(h) * v
            for i in range(3):
                outs.append(h.sum())
                cnt = (h.argmax() * 3 + cnt) % 5
        elif h.abs().max().item() > 1.0:
            h = h * 2.0
            h = self.l1(h)
        elif h.half().sum() > -0.5:
            h = self.sub(h)
        else:
            h = self.l1(h)
            if h.abs().max().item() > 0.5 or s > 2:
                return h * 2.0, s, cnt, len(outs), a
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a

