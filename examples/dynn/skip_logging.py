"""Gated blocks with a Python skip log, after Veit & Belongie, *Adaptive Inference Graphs*, ECCV 2018."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from examples.dynn import blocks_ran, image_inputs, seeded


class ResBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(out)))


class Gate(nn.Module):
    # global context -> probability of executing the next block
    def __init__(self, channels):
        super().__init__()
        self.fc = nn.Linear(channels, 1)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x):
        return torch.sigmoid(self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1)))


class GatedResNet(nn.Module):
    def __init__(self, channels=16, num_blocks=4, num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(channels), nn.ReLU())
        self.blocks = nn.ModuleList([ResBlock(channels) for _ in range(num_blocks)])
        self.gates = nn.ModuleList([Gate(channels) for _ in range(num_blocks)])
        self.fc = nn.Linear(channels, num_classes)
        self.last_skipped = []

    def forward(self, x):
        x = self.stem(x)
        skipped = []
        for t, block in enumerate(self.blocks):
            g = self.gates[t](x)
            if g.item() > 0.5:
                x = block(x)
            else:
                skipped.append(t)
        # kept for the execution-rate statistics logged after each batch
        self.last_skipped = skipped
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


NUM_BLOCKS = 4
BLOCKS = tuple("blocks.{}".format(t) for t in range(NUM_BLOCKS))
PATHS = tuple((name, ran) for name in BLOCKS for ran in (True, False))


def example() -> tuple[nn.Module, tuple]:
    # seed 26: with this init every gate opens for some inputs and closes for others
    with seeded(26):
        model = GatedResNet(num_blocks=NUM_BLOCKS).eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    return image_inputs(n, seed)


def path_of(model: nn.Module, args: tuple) -> tuple:
    return blocks_ran(model, args, BLOCKS)
