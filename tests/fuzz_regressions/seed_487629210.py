# Found by scripts/fuzz.py (seed 487629210), minimised: `outs.append(h.sum())` on one path of a tensor `if` in a
# `for` loop, `break` on the other, then `... if outs else ...`. Auto stages it as a padded program whose exits
# run both paths one after the other (padding.select); inside the loop's first iteration, a branch Python
# decided, the paths shared `outs`, so the exit saw the other path's append (len 1 for 0: every input that
# breaks at once wrong under staged and auto).
# scripts/fuzz.py seed 487629210 (staged): input 0 (scale 0.05): output 0: max |diff| 0.052
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
        for j in range(3):
            if cnt > 2:
                outs.append(h.sum())
            else:
                break
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return (h + total, s, cnt, len(outs), a)
