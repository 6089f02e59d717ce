# Found by scripts/fuzz.py (seed 34), minimised: an `if` that Python decides (on a Python int)
# inside a loop, whose branch updates `a` in place while `v` is the same tensor. The branch gave
# `a` a private copy (as a graph branch must), so `v` missed the update and the next iteration
# read the old `v`: torch's answer differed by 3e-3, silently. A Python-decided branch now keeps
# Python's aliasing; a graph branch around one that updates in place copies (or refuses a live
# alias) for it, as the second half checks.
import torch
import torch.nn as nn


class Fuzzed(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, h):
        v = h * 0.5
        a = v
        s = 0
        for j in range(3):
            if s > 1:
                v = torch.relu(h) - 0.1
            else:
                h = torch.sigmoid(h) * v
                a[0, 5] = h[1, 5]
        w = h * 0.5
        if h.sum() > 0:
            if s > 1:
                h = h + 1
            else:
                w[0, 1] = 5.0
                w.mul_(2.0)
        return h, a, w
