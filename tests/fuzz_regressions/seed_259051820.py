# Found by scripts/fuzz.py (seed 259051820), minimised: `t = a if v.sum() < 1.0 else v` (a is the view
# `v[:, :]`), then `t.mul_(0.5)`. The dispatch host passes `a`, `t` and `v` to the updating program with
# `t` the same array as `a` and `a` a view of `v`; its capture gave `t` the copy of `a` made before `a` was
# made a view of `v` again, so the update reached neither (every input wrong under dispatch and auto).
# scripts/fuzz.py seed 259051820 (dispatch): input 0 (scale 0.05): output 4: max |diff| 0.0215
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
        s = 0
        cnt = torch.zeros((), dtype=torch.long)
        outs = []
        w = v.transpose(0, 1)
        xs = [v]
        spare = []
        a = v[:, :]
        t = a if v.sum() < 1.0 else v
        t.mul_(0.5)
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return (h + total, s, cnt, len(outs), a, w * 1.0, xs[0] + 0.0, len(spare))
