# Found by scripts/fuzz.py (seed 224670785, a data-dependent-shape program): in a static loop with
# a tensor `break`, `sel = (h[1] < 1.0).nonzero(as_tuple=True)[0]` is assigned on the path that did
# not break only; the staged construct's placeholder for the other path needed `sel`'s size, a
# symbol of the other path's trace (torch: "u0 is not tracked with proxy", taken for a dycl_jax
# bug). Such a value is now refused as a path mismatch, so host="auto" runs it on the dispatch host.
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        h = h - h.mean() * 0.5
        if (h > 0).sum() > 6:
            h = self.lin(h)
            h = torch.tanh(h)
        elif (h > 0).sum() > 7:
            h = h * 1.5
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
        seq = h[:, :1] * 1.0
        toks = []
        if seq.shape[1] > 4: seq = seq[:, 1:]
        for j in range(3):
            if s > 1:
                sel = (h[1] < 1.0).nonzero(as_tuple=True)[0]
                if sel.numel() == 0: cnt = cnt + 1
            elif len(toks) > 1:
                outs.append(h.sum())
            elif h.sum() > 0.5:
                h = h + v
            else:
                if h.half().sum() > 0.5:
                    break
            sel = (h[1] < 1.0).nonzero(as_tuple=True)[0]
            if sel.numel() == 0: cnt = cnt + 1
        outs.append(h[h > 0.3].sum())
        if (h > 0).sum() > 5 or s > 0:
            return {'y': h * 2.0, 's': s, 'cnt': cnt, 'n': len(outs), 'a': a, 'seq': seq * 1.0, 'nt': len(toks), 'ts': sum(toks)}
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return {'y': h + total, 's': s, 'cnt': cnt, 'n': len(outs), 'a': a, 'seq': seq * 1.0, 'nt': len(toks), 'ts': sum(toks)}

