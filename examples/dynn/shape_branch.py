"""Shape-changing branch, cf. Bolukbasi et al., *Adaptive Neural Networks for Efficient Inference*, ICML 2017."""

from __future__ import annotations

import torch
import torch.nn as nn

from examples.dynn import count_calls, seeded


class TwoHeadNet(nn.Module):
    # a cheap head for easy inputs answers only the 4 coarse classes; the big one all 10
    def __init__(self, num_classes=10, num_coarse=4):
        super().__init__()
        self.num_coarse = num_coarse
        self.big = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, num_classes))
        self.small = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes))

    def forward(self, x):
        if x.mean() > 0:
            return self.big(x)  # (N, 10)
        else:
            return self.small(x)[:, :self.num_coarse]  # (N, 4)


PATHS = (("big",), ("small",))


def example() -> tuple[nn.Module, tuple]:
    with seeded(0):
        model = TwoHeadNet().eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    # a flat colour offset plus noise: the sign of the offset picks the branch
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        offset = torch.randn(1, 3, 1, 1, generator=g)
        out.append((offset + torch.randn(1, 3, 16, 16, generator=g),))
    return out


def path_of(model: nn.Module, args: tuple) -> tuple:
    with torch.no_grad(), count_calls(model, ["big", "small"]) as calls:
        model(*args)
    return (("big",),) if calls["big"] else (("small",),)
