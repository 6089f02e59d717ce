# Found by scripts/fuzz.py (seed 472927047): an `if a and b:` after a loop, in the host version of
# an island that did not stage, ran its test on the host with JAX arrays (AttributeError).
import torch
import torch.nn as nn


class Fuzzed(nn.Module):
    def __init__(self):
        super().__init__()
        self.l0 = nn.Linear(6, 6)
        self.l1 = nn.Linear(6, 6)
        self.l2 = nn.Linear(6, 6)

    def forward(self, h):
        v = h * 0.5
        s = 0
        cnt = torch.zeros((), dtype=torch.long)
        outs = []
        v = torch.tanh(h)
        n1 = torch.zeros((), dtype=torch.long)
        while h.sum() > -1.5 and n1 < 1:
            n1 = n1 + 1
            if h.sum() > -1.5:
                cnt = (h.argmax() * 7 + cnt) % 11
            h = h * 0.9 + 0.05
        if h.abs().max().item() > 0.5:
            if s > 1:
                h = torch.relu(h) - 0.1
            elif v.sum() < 2.0:
                outs.append(h.sum())
            else:
                h = self.l1(v) * 0.5 + h
                outs.append(h.sum())
            for _ in range(2):
                cnt = cnt + 1
                outs.append(h.sum())
        else:
            n2 = torch.zeros((), dtype=torch.long)
            while cnt > 0 and n2 < 4:
                n2 = n2 + 1
                h = torch.relu(h) - 0.1
                h = h * 0.9 + 0.05
            if h[0, 5] > 1.0:
                outs.append(h.sum())
            else:
                h = self.l1(h)
                h = torch.sigmoid(h) * v
        for _ in range(2):
            outs.append(h.sum())
            for i in range(3):
                s += 1
        if h.abs().max().item() > 0.0 and h.mean() < 0.5:
            if s > 1 or h.mean() < 2.0:
                return h * 2.0, s, cnt, len(outs)
        elif h.abs().max().item() > 1.5 or h[0, 1] > -0.5:
            s += 1
            n3 = torch.zeros((), dtype=torch.long)
            while v.sum() < -0.5 and n3 < 2:
                n3 = n3 + 1
                h = h - h.mean()
                h = h * 0.9 + 0.05
        else:
            if cnt > 0 or h[0, 1] > 0.0:
                return h * 2.0, s, cnt, len(outs)
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs)

