# Found by scripts/fuzz.py (seed 84854549), minimised: a tensor `if` whose only content is a static
# `for` with a data-dependent `break` (an `.item()` value `or` a tensor), nothing of it read later.
# The staged program holds no op for the `if` (no outputs), so none of its nested decisions, while
# the rewritten torch program ran the path and recorded the inner `if`'s decisions: jm.trace and
# run_torch_trace differed (outputs were equal). A construct with no outputs now records nothing
# inside it in torch either.
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
        w = v[:, 1:]
        if v.sum() < -0.5 or h.sum() > -0.5:
            for i in range(2):
                if h.abs().max().item() > 1.5 or h[0, 3] > -1.5:
                    break
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return (h + total, s, cnt, len(outs), a, w * 1.0)
