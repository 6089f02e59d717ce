# Found by scripts/fuzz.py (seed 773472307, minimised then reduced by hand): `a = v`, then in a
# static loop a Python `if` (decided by `s`) whose else-arm holds a tensor `if` that may rebind
# `v`, then `v.add_(h)`. torch's `a` sees the update on the paths that keep `v`; the staged
# program's did not: the tensor `if` runs inside the Python `if`'s generated else-function, which
# does not take `a`, so its alias check did not see that `v` still was `a`.
import torch
import torch.nn as nn

class Fuzzed(nn.Module):
    def __init__(self):
        super().__init__()
        self.l0 = nn.Linear(6, 6)

    def forward(self, h):
        v = h * 0.5
        a = v
        s = 0
        for j in range(2):
            if s > 2:
                continue
            else:
                pass
            if h.mean() < 2.0:
                pass
            else:
                v = torch.relu(h) - 0.1
        v.add_(h)
        return (h, a)
