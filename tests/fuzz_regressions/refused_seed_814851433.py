# Found by scripts/fuzz.py (seed 814851433) on a change that passed staged torch.cond / torch.while_loop a
# copy of an operand sharing memory with another (`w = v.transpose(0, 1)` beside `v`, the list item
# `xs[0]` updated in place inside a branch): the staged program then answered silently wrong for
# `w` (output 5). The change was reverted; such a program is refused with a located
# AliasedUpdateError on every host, never answered wrong.
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        h = torch.relu(h) - 0.1
        if h.mean() < 0.5:
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
        w = v.view(-1)
        xs = [v]
        if v.sum() < 0.0:
            return h * 2.0, s, cnt, len(outs), a, w * 1.0, xs[0] + 0.0
        cnt = (h.argmax() * 7 + cnt) % 5
        n1 = torch.zeros((), dtype=torch.long)
        while (h > 0).sum() > 7 and n1 < 3:
            n1 = n1 + 1
            v = h - h.mean() * 0.5
            h = h * 0.9 + 0.05
        for _ in range(2):
            for j in range(3):
                if h.half().sum() > 1.0:
                    return h * 2.0, s, cnt, len(outs), a, w * 1.0, xs[0] + 0.0
                xs[0].add_(h)
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a, w * 1.0, xs[0] + 0.0
