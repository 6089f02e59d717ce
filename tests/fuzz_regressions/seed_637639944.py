# Found by scripts/fuzz.py (seed 637639944), on the dispatch host: `a = v`, then an `if/elif`
# chain staged as an island inside a host branch rebinds `v` on one path only; the island's `v`
# was a new array on every path, so on the paths that leave `v` unchanged the later
# `v[:, 0] += 1.0` no longer reached `a` (off by 1, silently). When an island's output is, at
# the call, the same array as another name read later, its host version runs (Python's aliasing).
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        h = h - h.mean() * 0.5
        h = torch.relu(h) - 0.1
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
        h = h + v
        n1 = torch.zeros((), dtype=torch.long)
        while (h > 0).sum() > 9 and n1 < 4:
            n1 = n1 + 1
            outs.append(h.sum())
            h = h * 0.9 + 0.05
        if s > 0:
            n2 = torch.zeros((), dtype=torch.long)
            while cnt > 1 and n2 < 3:
                n2 = n2 + 1
                h = self.sub(h)
                h = h * 0.9 + 0.05
            hh = h.half(); hh = hh * hh.mean() - 0.5; h = hh.float() * 0.5 + h
        elif v.sum() < -1.5 and h[0, 2] > 2.0:
            if h[0, 2] > 0.5:
                h = (h.half() * 0.001).float() * 1000.0
                h = h * 2.0
            elif cnt > 1:
                cnt = (h.argmax() * 7 + cnt) % 5
                h = self.l1(v) * 0.5 + h
            elif h.sum() > 1.0:
                v = h + v
                h = (torch.tanh(h.half() * 1.5) + v.half()).float()
        elif cnt > 1:
            n3 = torch.zeros((), dtype=torch.long)
            while h.abs().max().item() > 1.5 and n3 < 2:
                n3 = n3 + 1
                h = self.sub(h)
                cnt = (h.argmax() * 1000003 + cnt) % 1009
                h = h * 0.9 + 0.05
            for _ in range(3):
                h = h - h.mean() * 0.5
        if s > 1:
            h = self.sub(h)
        elif h.half().sum() > 0.0 and (h > 0).sum() > 10:
            outs.append(h.sum())
        else:
            if h.abs().max().item() > 0.0:
                v[:, 0] += 1.0
                cnt = cnt + 1
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a

