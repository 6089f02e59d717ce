# Found by scripts/fuzz.py (seed 252902568), minimised and written with the alias made by tuple
# unpacking and held in a list: an early `return` under a tensor `if`, then `v.add_(h)`, which
# jump_else moves into the `else` branch; there `v` got a private copy and `a` (the same
# tensor) kept the old one, so the returned `a` and `xs[0]` missed the update, silently. The
# nested `if` then updates the tensor through `a` while `v` is read after it.
import torch
import torch.nn as nn


class Fuzzed(nn.Module):
    def __init__(self):
        super().__init__()
        self.l0 = nn.Linear(6, 6)

    def forward(self, h):
        v, w = h * 0.5, h
        a, b = v, w
        xs = [v]
        if (h > 0).sum() > 4 or h.abs().max().item() > 0.5:
            return h * 2.0, a, xs[0]
        v.add_(h)
        if h[0, 5] > 0.0:
            a.mul_(2.0)
        h = self.l0(h) + v
        return h, b, xs[0]
