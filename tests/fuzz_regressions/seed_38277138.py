# Found by scripts/fuzz.py (seed 38277138, dispatch host, decision trace only): one line holds
# two statements (`k = ...; h = ...`), so the island they start and the island inside its host
# version share one label. The first does not stage (an `.item()` read), the second stages. The
# rewritten torch program, replaying the host, ran the second's host version too (the set of
# failed islands, by label, overrode the host's recorded per-call choice) and recorded the `while`
# test that the staged island decides statically. The recorded choice now wins
# (rewrite/regions._replayed_choice).
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        if h.mean() < -0.5:
            return h * 2.0
        if h.mean() < 0.0:
            h = h * 0.5
        elif (h > 0).sum() > 7:
            h = torch.tanh(h)
            h = h - h.mean() * 0.5
        elif h.mean() < -1.5:
            h = h * 0.5
        else:
            h = h * 1.5
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
        h = self.sub(h)
        k = int((h[0] > -0.3).sum().item()); h = torch.cat([h[:, :k] * 0.5, h[:, k:]], dim=1)
        cnt = cnt + 1
        if seq.shape[1] > 2: seq = seq[:, 1:]
        n1 = torch.zeros((), dtype=torch.long)
        while seq.shape[1] > 3 and n1 < 2:
            n1 = n1 + 1
            outs.append(h[h > 0.3].sum())
            h = h * 0.9 + 0.05
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a, seq * 1.0, len(toks), sum(toks)

