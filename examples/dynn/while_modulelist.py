"""Early-exit ``while`` loop over a ModuleList, cf. Scardapane et al., *Why Should We Add Early Exits*, 2020."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from examples.dynn import seeded


class EarlyExitMLP(nn.Module):
    def __init__(self, in_features=24, hidden=32, num_layers=4, num_classes=10, threshold=0.5):
        super().__init__()
        self.threshold = threshold
        self.layers = nn.ModuleList(
            [nn.Sequential(nn.Linear(in_features if i == 0 else hidden, hidden), nn.ReLU()) for i in range(num_layers)])
        self.exits = nn.ModuleList([nn.Linear(hidden, num_classes) for _ in range(num_layers)])
        for layer in self.layers:
            nn.init.kaiming_normal_(layer[0].weight, nonlinearity="relu")
            nn.init.zeros_(layer[0].bias)
        for head in self.exits:
            nn.init.normal_(head.weight, 0, 0.3)
            nn.init.zeros_(head.bias)

    def forward(self, x):
        i = 0
        while i < len(self.layers):
            x = self.layers[i](x)
            logits = self.exits[i](x)
            conf = F.softmax(logits, -1).max()
            if conf > self.threshold:
                break
            i += 1
        # i == len(self.layers) when no exit was confident; logits are then the last exit's
        return logits, i


NUM_LAYERS = 4
THRESHOLD = 0.7
# ("exit", NUM_LAYERS): the loop ran out without a confident exit
PATHS = tuple(("exit", i) for i in range(NUM_LAYERS + 1))


def example() -> tuple[nn.Module, tuple]:
    # seed 6: with this init each exit is the first confident one for some inputs
    with seeded(6):
        model = EarlyExitMLP(num_layers=NUM_LAYERS, threshold=THRESHOLD).eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    # feature vectors at log-uniform scales: larger inputs give more confident exits
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        scale = float(torch.exp(torch.empty(()).uniform_(-1.0, 2.0, generator=g)))
        out.append((torch.randn(1, 24, generator=g) * scale,))
    return out


def path_of(model: nn.Module, args: tuple) -> tuple:
    with torch.no_grad():
        _, i = model(*args)
    return (("exit", int(i)),)
