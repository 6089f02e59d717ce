# Found by scripts/fuzz.py (seed 773472259, minimised): `a = v; xs = [v]`, a tensor `while` that
# may rebind `v`, then `xs[0].add_(h)` in a tensor `if` and `h = h + v`. Where the loop does not
# run, torch's `v` is still `xs[0]` and sees the update; the staged loop's `v` was a new tensor.
# The loop's alias check compared `v` with `xs` by identity only, not as a list holding it.
import torch
import torch.nn as nn

class Sub(nn.Module):

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        pass

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
        xs = [v]
        n1 = torch.zeros((), dtype=torch.long)
        while h.mean() < -1.5 and n1 < 1:
            n1 = n1 + 1
            v = h + v
        if h[0, 1] > 0.5:
            pass
        else:
            xs[0].add_(h)
        h = h + v
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return (h + total, s, cnt, len(outs), a, xs[0] + 0.0)
