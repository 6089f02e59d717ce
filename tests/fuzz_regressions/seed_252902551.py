# Found by scripts/fuzz.py (seed 252902551), minimised: `a = v`, an early `return` under a
# tensor `if` (with left-over code after it), then `v.add_(h)` and a nested branch with
# `a.mul_(0.5)`. jump_else moves the code after the exit into the `else` branch, whose function
# gave `v` and `a` a private copy each: `v.add_(h)` no longer reached `a`, and the alias check
# (names read after the `if`: none, everything returns) did not refuse. torch's `a` differed
# silently. Names bound to one tensor now share one copy in a branch (`own`), and an alias read
# after a branch is returned updated by it, one tensor with its alias again where every path
# keeps them so.
import torch
import torch.nn as nn


class Fuzzed(nn.Module):
    def __init__(self):
        super().__init__()
        self.l0 = nn.Linear(6, 6)

    def forward(self, h):
        v = h * 0.5
        a = v
        if v.sum() < 0.0:
            return h * 2.0, a
            h = self.l0(h)
        v.add_(h)
        if h.mean() < 0.5:
            a.mul_(0.5)
        else:
            v = torch.relu(h) - 0.1
        h = torch.sigmoid(h) * v
        return h, a
