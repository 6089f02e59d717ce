# Found by scripts/fuzz.py (seed 773472307, minimised): the same program as seed_773472307.py
# with `w = v[:, 1:]`, a view that no host can keep beside `v` once the loop may rebind `v`:
# refused with a located error (it was answered silently wrong by the staged host).
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
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return (h + total, s, cnt, len(outs), a, w * 1.0)
