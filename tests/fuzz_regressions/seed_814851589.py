# Found by scripts/fuzz.py (seed 814851589, reduced by hand): `a = v`, then a tensor `if/elif`
# that may rebind `v`, then an `if/elif/else` chain whose `else` updates `v` in place
# (`v[:, 5] += 1.0`), `a` returned. The dispatch host's island ending at the chain's test temp
# did not see that update as coming after it (the temp is located at the whole chain, and the
# chain's last line was taken as the island's end), so it returned `a` and `v` as two arrays and
# the later update missed `a`: off by 1 under host="dispatch" on input 5. Such an island now
# runs its host version (Python keeps the names one tensor).
import torch
import torch.nn as nn


class Fuzzed(nn.Module):
    def __init__(self):
        super().__init__()
        self.l0 = nn.Linear(6, 6)
        self.l1 = nn.Linear(6, 6)
        self.l2 = nn.Linear(6, 6)

    def forward(self, h):
        v = h * 0.5
        a = v
        s = 0
        cnt = torch.zeros((), dtype=torch.long)
        outs = []
        s += 1
        if h[0, 4] > 2.0:
            h = h * 0.3
            s += 1
        elif s > 1:
            v = self.l2(h)
        if cnt > 2:
            if (h > 0).sum() > 9:
                if s > 2:
                    return h * 2.0, s, cnt, len(outs), a
                cnt = (h.argmax() * 3 + cnt) % 1009
        elif h.half().sum() > -1.5:
            v = h * -0.25
        else:
            v[:, 5] += 1.0
        v = h + v
        return h, s, cnt, len(outs), a
