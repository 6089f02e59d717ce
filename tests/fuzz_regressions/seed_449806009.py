import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        h = self.lin(h)
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
        w = v.transpose(0, 1)
        for j in range(2):
            cnt = cnt + 1
            if h.sum() > 0.0 or h.half().sum() > 2.0:
                if h.abs().max().item() > 0.0:
                    break
            else:
                s += 1
                if h[0, 2] > 0.0 or v.sum() < 1.0:
                    break
        n1 = torch.zeros((), dtype=torch.long)
        while s > 0 and n1 < 4:
            n1 = n1 + 1
            if h[0, 5] > 1.0:
                h = h - h.mean() * 0.5
                h = torch.relu(h) - 0.1
            else:
                w.mul_(2.0)
                cnt = cnt + 1
            if h.mean() < 2.0:
                continue
            h = h * 0.9 + 0.05
        if not h.mean() < 2.0:
            if h.sum() > 0.0:
                h = h * 1.5
                s += 1
            elif h.sum() > -1.5:
                v = h - h.mean() * 0.5
            elif h.sum() > 2.0:
                h = self.l1(h)
                v = self.l2(v) * 0.5 + h
        else:
            outs.append(h.sum())
        outs.append(h.sum())
        h = self.l0(v) * 0.5 + h
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a, w * 1.0
