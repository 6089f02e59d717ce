# Found by scripts/fuzz.py (seed 1934115; reduced by hand): one submodule with a tensor `if`
# called six times in a static loop, after a tensor `while` that may return. The staged graph's
# six calls were rerolled into one lax.scan, but the calls share one module, so there were no
# per-block weights to stack and, every value being carried, nothing to scan over: jax.lax.scan
# raised "no values to scan over" (our crash while staging, on every input). The scan is now
# given its length.
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        if (h > 0).sum() > 9:
            h = self.lin(h)
            h = h * 0.5
        else:
            h = torch.relu(h) - 0.1
            h = torch.tanh(h)
        h = torch.tanh(h)
        return h


class Fuzzed(nn.Module):
    def __init__(self):
        super().__init__()
        self.l0 = nn.Linear(6, 6)
        self.l1 = nn.Linear(6, 6)
        self.l2 = nn.Linear(6, 6)
        self.sub = Sub()

    def forward(self, h):
        cnt = torch.zeros((), dtype=torch.long)
        n2 = torch.zeros((), dtype=torch.long)
        while (h > 0).sum() > 6 and n2 < 4:
            n2 = n2 + 1
            if cnt > 2:
                return h * 2.0
            h = h * 0.9 + 0.05
        for _ in range(6):
            h = self.sub(h)
        return h
