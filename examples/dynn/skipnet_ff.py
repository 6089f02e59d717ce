"""SkipNet with feed-forward gates (Wang et al., ECCV 2018): each residual block runs only if its gate opens."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from examples.dynn import blocks_ran, image_inputs, seeded


def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        residual = x
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            residual = self.downsample(x)
        return F.relu(out + residual)


class FeedforwardGate(nn.Module):
    # conv -> global pool -> 1x1 conv to one logit; hard 0/1 decision at test time
    def __init__(self, channel):
        super().__init__()
        self.conv1 = conv3x3(channel, channel)
        self.bn1 = nn.BatchNorm2d(channel)
        self.avg_layer = nn.AdaptiveAvgPool2d(1)
        self.linear_layer = nn.Conv2d(channel, 1, kernel_size=1)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.avg_layer(x)
        prob = torch.sigmoid(self.linear_layer(x))
        # straight-through discretisation: forward value is 0/1, gradient is the probability's
        disc = (prob > 0.5).float().detach() - prob.detach() + prob
        return disc.view(x.size(0), 1, 1, 1), prob.view(-1)


class ResNetFeedForwardSP(nn.Module):
    def __init__(self, layers=(2, 2, 2), num_classes=10):
        super().__init__()
        self.num_layers = list(layers)
        self.inplanes = 8
        self.conv1 = conv3x3(3, 8)
        self.bn1 = nn.BatchNorm2d(8)
        self._make_group(8, layers[0], group_id=1, stride=1)
        self._make_group(16, layers[1], group_id=2, stride=2)
        self._make_group(32, layers[2], group_id=3, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _make_group(self, planes, blocks, group_id, stride):
        for i in range(blocks):
            s = stride if i == 0 else 1
            downsample = None
            if s != 1 or self.inplanes != planes:
                downsample = nn.Sequential(
                    nn.Conv2d(self.inplanes, planes, kernel_size=1, stride=s, bias=False), nn.BatchNorm2d(planes))
            # the gate looks at the block's input
            setattr(self, "group{}_gate{}".format(group_id, i), FeedforwardGate(self.inplanes))
            setattr(self, "group{}_ds{}".format(group_id, i), downsample)
            setattr(self, "group{}_layer{}".format(group_id, i), BasicBlock(self.inplanes, planes, s, downsample))
            self.inplanes = planes

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        masks = []
        gprobs = []
        for g in range(3):
            for i in range(self.num_layers[g]):
                mask, gprob = getattr(self, "group{}_gate{}".format(g + 1, i))(x)
                masks.append(mask.squeeze())
                gprobs.append(gprob)
                if mask.item() > 0.5:
                    x = getattr(self, "group{}_layer{}".format(g + 1, i))(x)
                elif getattr(self, "group{}_ds{}".format(g + 1, i)) is not None:
                    # a skipped block that changes the shape still needs its shortcut
                    x = getattr(self, "group{}_ds{}".format(g + 1, i))(x)
        x = self.avgpool(x)
        x = x.view(x.size(0), -1)
        x = self.fc(x)
        return x, masks, gprobs


BLOCKS = tuple("group{}_layer{}".format(g, i) for g in (1, 2, 3) for i in range(2))
PATHS = tuple((name, ran) for name in BLOCKS for ran in (True, False))


def example() -> tuple[nn.Module, tuple]:
    # seed 1: with this init every gate opens for some inputs and closes for others
    with seeded(1):
        model = ResNetFeedForwardSP().eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    return image_inputs(n, seed)


def path_of(model: nn.Module, args: tuple) -> tuple:
    return blocks_ran(model, args, BLOCKS)
