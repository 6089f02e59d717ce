"""Small models the CLI and report tests convert (golden text: keep line numbers stable)."""
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width=8):
        super().__init__()
        self.conv1 = nn.Linear(width, width)
        self.gate = nn.Linear(width, 1)

    def forward(self, h):
        return torch.relu(self.conv1(h)), torch.sigmoid(self.gate(h)).mean()


class GatedNet(nn.Module):
    """A gated block per layer and an early exit: `if` on a tensor inside a Python loop."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        hidden = x
        scores = []
        for layer in self.layers:
            hidden, score = layer(hidden)
            scores.append(score)
            if score.item() > 0.5:
                hidden = hidden * 2
            else:
                hidden = hidden - 1
            if hidden.mean() > 3.0:
                return self.head(hidden), torch.stack(scores).sum()
        logits = self.head(hidden)
        return logits, torch.stack(scores).sum()


def gated():
    torch.manual_seed(0)
    return GatedNet()


class Shrink(nn.Module):
    """A shape decided by a value: the dispatch host."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, x):
        h = self.proj(x)
        keep = int((h[0] > 0).sum())
        kept = h[:, :keep]
        return kept * 2


_DRIFT = [1.0]


class Drift(nn.Module):
    """Reads and bumps a global on every call: torch's answer changes, the converted one cannot."""

    def forward(self, x):
        _DRIFT[0] += 1.0
        return x * _DRIFT[0]


import numpy as np  # noqa: E402  (below the other models: their line numbers are in golden text)


class Picker(nn.Module):
    """Python control flow on `.item()` values and a numpy argmax over them: the dispatch host."""

    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList([nn.Linear(4, 3) for _ in range(2)])

    def forward(self, x):
        scores = []
        for head in self.heads:
            out = head(x)
            conf = out.max()
            scores.append(conf)
            if conf.item() > 1.0:
                return out
        best = int(np.argmax([s.item() for s in scores]))
        return self.heads[best](x) * 2


def picker():
    torch.manual_seed(0)
    return Picker()


class Noisy(nn.Module):
    """Draws noise: the dispatch host runs the draw in torch, on torch's generator, whose state
    differs between the check's torch call and the converted call, so parity fails."""

    def forward(self, x):
        return x + torch.rand_like(x)
