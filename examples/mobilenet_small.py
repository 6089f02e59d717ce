"""A MobileNetV3-style network: depthwise-separable blocks, ReLU6/hardswish, squeeze-excite,
plus a small feature-fusion head (bilinear F.interpolate, GroupNorm)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from examples.resnet_small import randomize_norm_stats


def _make_divisible(v: float, divisor: int = 8) -> int:
    return max(divisor, int(v + divisor / 2) // divisor * divisor)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduction: int = 4):
        super().__init__()
        hidden = _make_divisible(channels // reduction)
        self.fc1 = nn.Conv2d(channels, hidden, 1)
        self.fc2 = nn.Conv2d(hidden, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        s = F.relu(self.fc1(s))
        return x * F.hardsigmoid(self.fc2(s))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, expand: int, cout: int, kernel: int, stride: int, use_se: bool, act: str):
        super().__init__()
        Act = nn.Hardswish if act == "hs" else nn.ReLU6
        self.use_res = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expand != cin:
            layers += [nn.Conv2d(cin, expand, 1, bias=False), nn.BatchNorm2d(expand), Act()]
        # depthwise: one filter per channel
        layers += [
            nn.Conv2d(expand, expand, kernel, stride, kernel // 2, groups=expand, bias=False),
            nn.BatchNorm2d(expand),
            Act(),
        ]
        if use_se:
            layers.append(SqueezeExcite(expand))
        layers += [nn.Conv2d(expand, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.use_res else out


class MobileNetSmall(nn.Module):
    # (expand, out, kernel, stride, se, activation)
    CFG = [
        (16, 16, 3, 2, True, "re"),
        (48, 24, 3, 2, False, "re"),
        (64, 24, 3, 1, False, "re"),
        (72, 40, 5, 2, True, "hs"),
    ]

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
        blocks, cin = [], 16
        for expand, cout, k, s, se, act in self.CFG:
            blocks.append(InvertedResidual(cin, expand, cout, k, s, se, act))
            cin = cout
        self.low = nn.Sequential(*blocks[:3])  # stride 8 features
        self.high = nn.Sequential(*blocks[3:])  # stride 16 features
        # fuse the deep features, upsampled, into the shallow ones
        self.lateral = nn.Conv2d(24, 40, 1)
        self.fuse = nn.Sequential(nn.Conv2d(40, 64, 3, padding=1, bias=False), nn.GroupNorm(8, 64), nn.ReLU())
        self.classifier = nn.Sequential(
            nn.Linear(64 * 2 * 2, 96), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(96, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low = self.low(self.stem(x))
        high = self.high(low)
        up = F.interpolate(high, size=low.shape[-2:], mode="bilinear", align_corners=False)
        x = self.fuse(self.lateral(low) + up)
        x = F.adaptive_avg_pool2d(x, 2).flatten(1)  # keep coarse spatial layout
        return self.classifier(x)


def inputs(batch: int, seed: int = 0) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 3, 32, 32, generator=g),)


def example() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model = MobileNetSmall()
    randomize_norm_stats(model)
    return model.eval(), inputs(2)
