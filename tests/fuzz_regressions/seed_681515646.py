# Found by scripts/fuzz.py (seed 681515646): `v` read early (`a = v`, `w = v.view(-1)`), then
# reassigned only inside `if s > 1:` after an early return, and never read again. The dispatch
# host's island for the tail made `v` an output (it counted every read of `v` anywhere in the
# method, not liveness), so the staged `if` carried `v` in and out, while the region before
# (by liveness) never produced it: conversion crashed with UnboundLocalError for `v` on every
# input under host="auto" and "dispatch". Island outputs now follow liveness where it is known.
import torch
import torch.nn as nn


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        h = self.lin(h)
        if h.sum() > -0.5:
            return h * 2.0
        h = torch.tanh(h)
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
        w = v.view(-1)
        if h.sum() > 0.0:
            return h * 2.0, s, cnt, len(outs), a, w * 1.0
        h = torch.relu(h) - 0.1
        h = h - h.mean() * 0.5
        if s > 1:
            v = h * 0.5
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, s, cnt, len(outs), a, w * 1.0
