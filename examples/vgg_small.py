"""A VGG-style network: stacked 3x3 convolutions, max pooling, a dropout classifier."""
from __future__ import annotations

import torch
import torch.nn as nn

from examples.resnet_small import randomize_norm_stats

CFG = [16, "M", 32, 32, "M", 64, 64, "M"]


def make_layers(cfg: list, batch_norm: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    in_channels = 3
    for v in cfg:
        if v == "M":
            # ceil_mode keeps the odd last row/column instead of dropping it
            layers += [nn.MaxPool2d(kernel_size=2, stride=2, ceil_mode=True)]
        else:
            conv = nn.Conv2d(in_channels, v, kernel_size=3, padding=1)
            layers += [conv, nn.BatchNorm2d(v), nn.ReLU(inplace=True)] if batch_norm else [conv, nn.ReLU(inplace=True)]
            in_channels = v
    return nn.Sequential(*layers)


class VGGSmall(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = make_layers(CFG)
        self.avgpool = nn.AdaptiveAvgPool2d((3, 3))
        self.classifier = nn.Sequential(
            nn.Linear(64 * 3 * 3, 128),
            nn.ReLU(True),
            nn.Dropout(),
            nn.Linear(128, 128),
            nn.ReLU(True),
            nn.Dropout(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = self.avgpool(x)  # 4x4 -> 3x3: overlapping, non-divisible bins
        x = torch.flatten(x, 1)
        return self.classifier(x)


def inputs(batch: int, seed: int = 0) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 3, 27, 27, generator=g),)


def example() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model = VGGSmall()
    randomize_norm_stats(model)
    return model.eval(), inputs(2)
