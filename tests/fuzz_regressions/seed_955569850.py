# Found by scripts/fuzz.py (seed 955569850, dispatch host) after views were kept across programs:
# in a host loop, `v = torch.sigmoid(h) * v` rebinds `v` while `a.add_(0.5)` updates the tensor
# `a` and the old `v` both held; the view `w = v[:, 1:]` was registered on `v`'s new (unrelated)
# tensor, so the next iteration made `w` from it (output 5 wrong). The updated tensor is the
# output of a name the part does not rebind (host/views._trackable).
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        if h.abs().max().item() > 1.0:
            h = h * 0.5
        if (h > 0).sum() > 3:
            h = torch.relu(h) - 0.1
            h = torch.relu(h) - 0.1
        else:
            h = h * 2.0
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
        w = v[:, 1:]
        seq = h[:, :1] * 1.0
        toks = []
        spare = []
        h = torch.sigmoid(h) * v
        n1 = torch.zeros((), dtype=torch.long)
        while cnt > 1 and n1 < 4:
            n1 = n1 + 1
            for _ in range(3):
                cnt = (h.argmax() * 3 + cnt) % 5
            h = h * 0.9 + 0.05
        if cnt > 2:
            return h * 2.0, s, cnt, len(outs), a, w * 1.0, seq * 1.0, len(toks), sum(toks), len(spare)
        if h.half().sum() > 0.5:
            toks.append(int(h[0].argmax().item()))
            for i in range(2):
                v = torch.sigmoid(h) * v
                a.add_(0.5)
        v = h * 0.5
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a, w * 1.0, seq * 1.0, len(toks), sum(toks), len(spare)
