# Found by scripts/fuzz.py (seed 603013928): `w = v.transpose(0, 1)` read by a tensor `while`
# (carried: an early return inside reads it). Staging crashed inside dycl_jax with torch's
# while_loop check ("carried_inputs and body_output ... stride (s95, 1) vs (1, 6)"): the carried
# view kept its strides, the body's copy did not. A loop that updates nothing in place now takes
# contiguous copies of its carries (and copies of operands sharing memory).
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        if h.sum() > 1.0:
            return h * 2.0
        if (h > 0).sum() > 1:
            h = h * -0.25
            h = h - h.mean() * 0.5
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
        w = v.transpose(0, 1)
        xs = [v]
        h = self.l2(v) * 0.5 + h
        if h.abs().max().item() > 2.0:
            n1 = torch.zeros((), dtype=torch.long)
            while h[0, 0] > 1.0 and n1 < 1:
                n1 = n1 + 1
                if not s > 2:
                    return h * 2.0, s, cnt, len(outs), a, w * 1.0, xs[0] + 0.0
                h = h * 0.9 + 0.05
            v = h * -0.25
        else:
            n2 = torch.zeros((), dtype=torch.long)
            while cnt > 1 and n2 < 2:
                n2 = n2 + 1
                cnt = cnt + 1
                if h.abs().max().item() > 0.5 or (h > 0).sum() > 2:
                    break
                h = h * 0.9 + 0.05
            h = self.l1(v) * 0.5 + h
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a, w * 1.0, xs[0] + 0.0

