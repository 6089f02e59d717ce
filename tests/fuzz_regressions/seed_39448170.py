# Found by scripts/fuzz.py (seed 39448170; it fails at older commits too), on the dispatch host:
# `a = v`, then in a static loop inside an `if`/`elif` chain `a[0, 3] = h[1, 3]` while
# `self.l0(v)` reads `v`; torch's answer differed by 0.19, silently. It matches since names of
# one tensor share one copy in converted branches and captured regions take input leaves that
# are one array as one tensor (capture/region.py); not minimised further.
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        h = h - h.mean() * 0.5
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
        if h.mean() < 0.0:
            outs.append(h.sum())
            for _ in range(3):
                h = self.l0(v) * 0.5 + h
                a[0, 3] = h[1, 3]
        elif h.mean() < -0.5:
            h = (torch.tanh(h.half() * 0.25) + v.half()).float()
            if not (h > 0).sum() > 9:
                h = self.l0(h)
                h = torch.sigmoid(h) * v
            elif h.sum() > -0.5 and h.mean() < 0.0:
                cnt = cnt + 1
            else:
                h = (h.half() * 0.001).float() * 1000.0
        elif h.sum() > 1.0:
            if h.sum() > 0.0:
                h = h - h.mean() * 0.5
                h = self.l0(h)
            elif not cnt > 0:
                hh = h.half(); hh = hh * hh.mean() - 0.5; h = hh.float() * 0.5 + h
                h = self.sub(h)
            elif not cnt > 1:
                h = h + v
            else:
                hh = h.half(); hh = hh * hh.mean() - 0.5; h = hh.float() * 0.5 + h
                h = (torch.tanh(h.half() * 0.25) + v.half()).float()
        else:
            a[0, 5] = h[1, 5]
            for i in range(3):
                v = h * -0.25
        hh = h.half(); hh = hh * hh.mean() - 0.5; h = hh.float() * 0.5 + h
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a

