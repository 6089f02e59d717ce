"""Input-energy path selection: an if/elif/elif/else picks one of four differently sized sub-networks."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from examples.dynn import count_calls, seeded


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


class EnergyPathNet(nn.Module):
    """Low-energy (flat, easy) inputs take the cheapest path; the heavier paths are kept for
    inputs with more signal. Thresholds are on the mean squared pixel value."""

    def __init__(self, num_classes=10, thresholds=(0.25, 1.0, 4.0)):
        super().__init__()
        self.a, self.b, self.c = thresholds
        self.tiny = nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(12, num_classes))
        self.small = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes))
        self.medium = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes))
        self.large = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            ResBlock(32), nn.MaxPool2d(2), ResBlock(32),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes))

    def forward(self, x):
        e = x.pow(2).mean()
        if e < self.a:
            out = self.tiny(x)
        elif e < self.b:
            out = self.small(x)
        elif e < self.c:
            out = self.medium(x)
        else:
            out = self.large(x)
        return out


ARMS = ("tiny", "small", "medium", "large")
PATHS = tuple(("arm", name) for name in ARMS)


def example() -> tuple[nn.Module, tuple]:
    with seeded(0):
        model = EnergyPathNet().eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    # log-uniform pixel scale: the energy (about scale ** 2) spans all four arms
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        scale = float(torch.exp(torch.empty(()).uniform_(-1.5, 1.5, generator=g)))
        out.append((torch.randn(1, 3, 16, 16, generator=g) * scale,))
    return out


def path_of(model: nn.Module, args: tuple) -> tuple:
    with torch.no_grad(), count_calls(model, list(ARMS)) as calls:
        model(*args)
    return tuple(("arm", name) for name in ARMS if calls[name] > 0)
