"""A Wide-ResNet-style network (pre-activation wide blocks with dropout between the convolutions)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from examples.resnet_small import randomize_norm_stats


class WideBasic(nn.Module):
    def __init__(self, in_planes: int, planes: int, dropout_rate: float, stride: int = 1):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, padding=1, bias=True)
        self.dropout = nn.Dropout(p=dropout_rate)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=stride, padding=1, bias=True)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.dropout(self.conv1(F.relu(self.bn1(x))))
        out = self.conv2(F.relu(self.bn2(out)))
        return out + self.shortcut(x)


class WideResNet(nn.Module):
    def __init__(self, depth: int = 10, widen_factor: int = 2, dropout_rate: float = 0.3, num_classes: int = 10):
        super().__init__()
        assert (depth - 4) % 6 == 0, "Wide-resnet depth should be 6n+4"
        n = (depth - 4) // 6
        k = widen_factor
        stages = [8, 8 * k, 16 * k, 32 * k]
        self.in_planes = stages[0]
        self.conv1 = nn.Conv2d(3, stages[0], kernel_size=3, stride=1, padding=1, bias=True)
        self.layer1 = self._wide_layer(stages[1], n, dropout_rate, stride=1)
        self.layer2 = self._wide_layer(stages[2], n, dropout_rate, stride=2)
        self.layer3 = self._wide_layer(stages[3], n, dropout_rate, stride=2)
        self.bn1 = nn.BatchNorm2d(stages[3], momentum=0.9)
        self.linear = nn.Linear(stages[3], num_classes)

    def _wide_layer(self, planes: int, num_blocks: int, dropout_rate: float, stride: int) -> nn.Sequential:
        strides = [stride] + [1] * (num_blocks - 1)
        layers = []
        for s in strides:
            layers.append(WideBasic(self.in_planes, planes, dropout_rate, s))
            self.in_planes = planes
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(x)
        out = self.layer3(self.layer2(self.layer1(out)))
        out = F.relu(self.bn1(out))
        # a fixed 4x4 window instead of global pooling, with the last row/column padded
        out = F.avg_pool2d(out, 4, stride=3, padding=1, ceil_mode=True, count_include_pad=False)
        out = out.mean(dim=(2, 3))
        return self.linear(out)


def inputs(batch: int, seed: int = 0) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 3, 20, 20, generator=g),)


def example() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model = WideResNet()
    randomize_norm_stats(model)
    return model.eval(), inputs(2)
