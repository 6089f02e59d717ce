# Found by scripts/fuzz.py (seed 458362664), on the staged host, and reduced by deleting lines
# while it still failed: after an `if` whose nested `return` was not taken, an if/elif chain with
# a `return` nested in its first branch. The rest of the method was guarded with the chain as one
# run, so the final `return` ran even after the chain's return (off by 6.4, silently); a
# statement that may set the return flag now ends its guard's run (rewrite/converters/flags.py).
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        if (h > 0).sum() > 9:
            return h * 2.0
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
        if h.mean() < 2.0:
            if not (h > 0).sum() > 7:
                return h * 2.0, s, cnt, len(outs), a
        if h.sum() > -0.5:
            if h.half().sum() > 1.0:
                return h * 2.0, s, cnt, len(outs), a
        elif s > 1:
                pass
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a
