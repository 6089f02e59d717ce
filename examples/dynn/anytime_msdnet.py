"""Multi-Scale DenseNet (Huang et al., ICLR 2018) evaluated anytime: stop at the first confident classifier."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from examples.dynn import image_inputs, seeded


class ConvBasic(nn.Module):
    def __init__(self, nIn, nOut, kernel=3, stride=1, padding=1):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(nIn, nOut, kernel_size=kernel, stride=stride, padding=padding, bias=False),
            nn.BatchNorm2d(nOut), nn.ReLU(True))

    def forward(self, x):
        return self.net(x)


class MSDNFirstLayer(nn.Module):
    # one feature map per scale, each half the resolution of the previous
    def __init__(self, nIn, channels):
        super().__init__()
        self.layers = nn.ModuleList()
        self.layers.append(ConvBasic(nIn, channels[0]))
        for i in range(1, len(channels)):
            self.layers.append(ConvBasic(channels[i - 1], channels[i], stride=2))

    def forward(self, x):
        res = []
        for i in range(len(self.layers)):
            x = self.layers[i](x)
            res.append(x)
        return res


class MSDNLayer(nn.Module):
    """Dense layer across scales: each output scale appends features from its own scale
    and (strided) from the next finer one. With drop_finest the finest scale is discarded."""

    def __init__(self, channels_in, growth, drop_finest=False):
        super().__init__()
        self.nIn = len(channels_in)
        self.offset = 1 if drop_finest else 0
        self.nOut = self.nIn - self.offset
        self.layers = nn.ModuleList()
        for s in range(self.offset, self.nIn):
            if s == 0:
                self.layers.append(nn.ModuleList([ConvBasic(channels_in[s], growth[s])]))
            else:
                self.layers.append(nn.ModuleList([
                    ConvBasic(channels_in[s - 1], growth[s] // 2, stride=2),
                    ConvBasic(channels_in[s], growth[s] // 2)]))

    def forward(self, x):
        res = []
        for i in range(self.nOut):
            s = i + self.offset
            if s == 0:
                res.append(torch.cat([x[0], self.layers[i][0](x[0])], dim=1))
            else:
                res.append(torch.cat([x[s], self.layers[i][0](x[s - 1]), self.layers[i][1](x[s])], dim=1))
        return res


class ClassifierModule(nn.Module):
    def __init__(self, channels, num_classes):
        super().__init__()
        self.m = nn.Sequential(ConvBasic(channels, channels), nn.AdaptiveAvgPool2d(1))
        self.linear = nn.Linear(channels, num_classes)

    def forward(self, x):
        # classifiers only look at the coarsest scale
        res = self.m(x[-1])
        return self.linear(res.view(res.size(0), -1))


class MSDNet(nn.Module):
    def __init__(self, nBlocks=4, base=(8, 16, 16), growth=(4, 8, 8), num_classes=10,
                 thresholds=(0.275, 0.4, 0.225)):
        super().__init__()
        self.nBlocks = nBlocks
        self.thresholds = list(thresholds)
        self.first = MSDNFirstLayer(3, list(base))
        channels = list(base)
        self.blocks = nn.ModuleList()
        self.classifier = nn.ModuleList()
        for i in range(nBlocks):
            # the last blocks stop computing the finest scales, as in the paper
            drop = i >= nBlocks - 2 and len(channels) > 1
            layer = MSDNLayer(channels, growth[-len(channels):], drop_finest=drop)
            if drop:
                channels = channels[1:]
                grown = growth[-len(channels):]
            else:
                grown = growth[-len(channels):]
            channels = [c + g for c, g in zip(channels, grown)]
            self.blocks.append(layer)
            self.classifier.append(ClassifierModule(channels[-1], num_classes))
        # parameter count as the cost proxy for the budgeted mode
        self.block_cost = [sum(p.numel() for p in b.parameters()) + sum(p.numel() for p in c.parameters())
                           for b, c in zip(self.blocks, self.classifier)]
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.3)
                nn.init.zeros_(m.bias)

    def forward(self, x, budget=None):
        x = self.first(x)
        spent = 0
        for i in range(self.nBlocks):
            x = self.blocks[i](x)
            res = self.classifier[i](x)
            spent += self.block_cost[i]
            if i == self.nBlocks - 1:
                break
            confidence = F.softmax(res, dim=1).max()
            if confidence.item() >= self.thresholds[i]:
                break
            # the next block would not fit in the budget: answer now
            if budget is not None and spent + self.block_cost[i + 1] > budget:
                break
        return res, i


NUM_BLOCKS = 4
PATHS = tuple(("exit", i) for i in range(NUM_BLOCKS))


def example() -> tuple[nn.Module, tuple]:
    with seeded(0):
        model = MSDNet(nBlocks=NUM_BLOCKS).eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    return image_inputs(n, seed, log_scale=(-1.0, 1.5))


def path_of(model: nn.Module, args: tuple) -> tuple:
    with torch.no_grad():
        _, exit_id = model(*args)
    return (("exit", int(exit_id)),)
