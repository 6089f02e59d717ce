# Found by scripts/fuzz.py (seed 621427429) in its first campaign with values kept on `self`:
# `while self.t.item() < -0.25 and n2 < 1:` compares a loop invariant (`self.t`, a local of the
# method since converters/self_attributes.py; a plain local does the same) with a constant, and the
# static trip-bound search (lower/loop_bounds.py) took its placeholder index, beyond the carried
# values, for a counter's: an IndexError while staging. Invariants are skipped now.
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        if h.mean() < 2.0:
            return h * 2.0
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
        self.k = 0
        self.t = h.sum() * 0.0
        n1 = torch.zeros((), dtype=torch.long)
        while h.abs().max().item() > 0.0 and n1 < 1:
            n1 = n1 + 1
            for i in range(1):
                cnt = (h.argmax() * 3 + cnt) % 11
                cnt = (h.argmax() * 7 + cnt) % 11
            h = h * 0.9 + 0.05
        for j in range(3):
            v = h + v
            n2 = torch.zeros((), dtype=torch.long)
            while self.t.item() < -0.25 and n2 < 1:
                n2 = n2 + 1
                if self.t.item() < -0.25:
                    break
                h = h * 0.9 + 0.05
        if v.sum() < -1.5:
            return h * 2.0, s, cnt, len(outs), a, self.k, self.t * 1.0
        for j in range(3):
            h = h + self.t * 0.1
            if self.k > 0:
                break
        if self.t.item() < -0.25:
            self.t = self.t + h.mean()
        elif self.t > 0.5 or h.half().sum() > 1.0:
            if self.t > 0.5:
                self.k += 1
                cnt = (h.argmax() * 3 + cnt) % 11
            elif self.k > 2 and v.sum() < -1.5:
                h = self.l2(h)
            else:
                self.t = self.t - self.k * 0.25
            cnt = (h.argmax() * 1000003 + cnt) % 11
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a, self.k, self.t * 1.0

