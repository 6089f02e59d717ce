# Found by scripts/fuzz.py (seed 399509941): `xs = [v]`, then a tensor `while` whose body does
# `xs[0].add_(h)` and reads `v` (`h = h + v`): torch changes `v` on every iteration; the staged loop
# carried the list and `v` apart, so `v` went stale from the second iteration: a silent wrong answer
# (off by 334) on every host. It is refused now (`w = v[0]`, a view of that tensor, is read
# after the loop, which no host keeps apart); a match would do too.
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        h = torch.tanh(h)
        if h[0, 2] > -0.5:
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
        w = v[0]
        xs = [v]
        n1 = torch.zeros((), dtype=torch.long)
        while h.half().sum() > 2.0 and n1 < 3:
            n1 = n1 + 1
            xs[0].add_(h)
            h = h + v
            h = h * 0.9 + 0.05
        outs.append(h.sum())
        for _ in range(2):
            h = h * 1.5
        h = torch.relu(h) - 0.1
        if h.half().sum() > 2.0:
            outs.append(h.sum())
            if not s > 1:
                if (h > 0).sum() > 11:
                    return h * 2.0, s, cnt, len(outs), a, w * 1.0, xs[0] + 0.0
                v = torch.tanh(h)
            else:
                if s > 1 and s > 2:
                    return h * 2.0, s, cnt, len(outs), a, w * 1.0, xs[0] + 0.0
        else:
            for _ in range(2):
                cnt = cnt + 1
            if h[0, 3] > -0.5:
                return h * 2.0, s, cnt, len(outs), a, w * 1.0, xs[0] + 0.0
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a, w * 1.0, xs[0] + 0.0

