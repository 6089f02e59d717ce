# Found by scripts/fuzz.py (seed 38277010, a data-dependent-shape program): `elif
# (h[0] > 0.0).nonzero().numel() > 4:` inside a branch of auto's padded attempt. torch's guard on
# the data-dependent count was raised while torch handled an exception of its own, so the guard
# was not the chain's root, and host="auto" took it for a dycl_jax bug instead of moving to the
# dispatch host (select.internal_cause now reads every exception torch raised in the chain).
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        h = h - h.mean() * 0.5
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
        seq = h[:, :1] * 1.0
        toks = []
        h = torch.tanh(h)
        n1 = torch.zeros((), dtype=torch.long)
        while (h > 0).sum() > 2 and n1 < 4:
            n1 = n1 + 1
            outs.append(h[h > 1.0].sum())
            h = torch.sigmoid(h) * v
            h = h * 0.9 + 0.05
        cnt = cnt + 1
        if (h[0] > 0.0).nonzero().numel() > 4:
            s += 1
            seq = torch.cat([seq, h[:, 4:5] * 0.5], dim=1)
        elif h.abs().max().item() > 1.5:
            h = torch.tanh(h)
            if (h[0] > 0.0).nonzero().numel() > 4 or (h > 0).sum() > 1:
                v = h - h.mean() * 0.5
                if seq.shape[1] > 2: seq = seq[:, 1:]
            else:
                if seq.shape[1] > 2: seq = seq[:, 1:]
                toks.append(int((h > -0.3).sum()))
        elif h.sum() > 2.0:
            h = self.l0(h)
        else:
            if v.sum() < -1.5 or h.half().sum() > 0.0:
                toks.append(int(h[0].argmax().item()))
            elif h.mean() < -1.5 or len(toks) > 1:
                s += 1
            else:
                cnt = (h.argmax() * 3 + cnt) % 11
            seq = torch.cat([seq, torch.tanh(seq[:, -1:]) + h[:, 3:4]], dim=1)
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a, seq * 1.0, len(toks), sum(toks)

