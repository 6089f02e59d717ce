# Found by scripts/fuzz.py (seed 220380291), on the dispatch host: `a = v`, then an if/elif chain
# staged as an island rebinds `v` on one path only (`v = h + v`) and returns `v` and `a`, which
# on the other paths torch leaves one tensor; the island's two outputs were two arrays, so the
# later `v.add_(h)` on the host never reached `a` (off by 0.392, silently). Where two outputs may
# be one tensor and a later statement updates one in place, the host version runs when they are
# one array at the call, and a region's in-place update returns every live alias as well.
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        h = h - h.mean() * 0.5
        h = h * 0.5
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
        n1 = torch.zeros((), dtype=torch.long)
        while v.sum() < 0.5 and n1 < 3:
            n1 = n1 + 1
            outs.append(h.sum())
            if h[0, 0] > 2.0 or h.mean() < 2.0:
                s += 1
                h = torch.relu(h) - 0.1
            h = h * 0.9 + 0.05
        n2 = torch.zeros((), dtype=torch.long)
        while v.sum() < 0.5 and n2 < 4:
            n2 = n2 + 1
            h = self.sub(h)
            if cnt > 1:
                v = self.l2(v) * 0.5 + h
                hh = h.half(); hh = hh * hh.mean() - 0.5; h = hh.float() * 0.5 + h
            elif h[0, 2] > 0.5:
                cnt = cnt + 1
            elif not (h > 0).sum() > 3:
                cnt = cnt + 1
            h = h * 0.9 + 0.05
        if (h > 0).sum() > 5:
            if (h > 0).sum() > 3:
                v[:, 5] += 1.0
            elif h.sum() > 0.5 and h.half().sum() > 2.0:
                cnt = cnt + 1
                v = h + v
            hh = h.half(); hh = hh * hh.mean() - 0.5; h = hh.float() * 0.5 + h
        else:
            cnt = cnt + 1
            if h.sum() > 2.0:
                h = h * 1.5
            else:
                h = self.l0(v) * 0.5 + h
        v.add_(h)
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a

