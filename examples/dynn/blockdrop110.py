"""BlockDrop on ResNet-110 (Wu et al., CVPR 2018; the DyCL paper's model): 54 gated residual blocks on CIFAR-size images.

The conversion-time and memory benchmark (`scripts/bench_convert.py`); not in `MODELS`, as
one conversion takes tens of seconds. `blockdrop.py` is the small version of the same code.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from examples.dynn import blocks_ran, seeded


def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1):
        super(BasicBlock, self).__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return out


class DownsampleB(nn.Module):
    def __init__(self, nIn, nOut, stride):
        super(DownsampleB, self).__init__()
        self.avg = nn.AvgPool2d(stride)
        self.expand_ratio = nOut // nIn

    def forward(self, x):
        x = self.avg(x)
        return torch.cat([x] + [x.mul(0)] * (self.expand_ratio - 1), 1)


class FlatResNet110(nn.Module):
    # ResNet-110 for CIFAR: 3 segments of 18 basic blocks, 16/32/64 channels
    def __init__(self, layers=(18, 18, 18), num_classes=10):
        super(FlatResNet110, self).__init__()
        self.inplanes = 16
        self.conv1 = conv3x3(3, 16)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.avgpool = nn.AvgPool2d(8)

        strides = [1, 2, 2]
        filt_sizes = [16, 32, 64]
        self.blocks, self.ds = [], []
        for idx, (filt_size, num_blocks, stride) in enumerate(zip(filt_sizes, layers, strides)):
            blocks, ds = self._make_layer(filt_size, num_blocks, stride)
            self.blocks.append(nn.ModuleList(blocks))
            self.ds.append(ds)
        self.blocks = nn.ModuleList(self.blocks)
        self.ds = nn.ModuleList(self.ds)
        self.fc = nn.Linear(64, num_classes)
        self.layer_config = layers

    def _make_layer(self, planes, blocks, stride=1):
        downsample = nn.Sequential()
        if stride != 1 or self.inplanes != planes:
            downsample = DownsampleB(self.inplanes, planes, stride)
        layers = [BasicBlock(self.inplanes, planes, stride)]
        self.inplanes = planes
        for i in range(1, blocks):
            layers.append(BasicBlock(self.inplanes, planes))
        return layers, downsample

    def seed(self, x):
        return self.relu(self.bn1(self.conv1(x)))

    def forward(self, x, policy):
        x = self.seed(x)
        t = 0
        for segment, num_blocks in enumerate(self.layer_config):
            for b in range(num_blocks):
                action = policy[:, t].contiguous()
                residual = self.ds[segment](x) if b == 0 else x

                # early termination if all actions in the batch are zero
                if action.data.sum() == 0:
                    x = residual
                    t += 1
                    continue

                action_mask = action.float().view(-1, 1, 1, 1)
                fx = F.relu(residual + self.blocks[segment][b](x))
                x = fx * action_mask + residual * (1 - action_mask)
                t += 1

        x = self.avgpool(x)
        x = x.view(x.size(0), -1)
        x = self.fc(x)
        return x


class Policy(nn.Module):
    # a small conv agent over the image; one keep/drop logit per block
    def __init__(self, num_blocks):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1))
        self.logit = nn.Linear(32, num_blocks)
        nn.init.zeros_(self.logit.bias)

    def forward(self, x):
        x = self.features(x).view(x.size(0), -1)
        return torch.sigmoid(self.logit(x))


class BlockDrop110(nn.Module):
    def __init__(self, layers=(18, 18, 18), num_classes=10):
        super().__init__()
        self.agent = Policy(sum(layers))
        self.rnet = FlatResNet110(layers, num_classes)

    def forward(self, inputs):
        probs = self.agent(inputs)
        policy = (probs > 0.5).float()
        preds = self.rnet(inputs, policy)
        return preds, policy


BLOCKS = tuple("rnet.blocks.{}.{}".format(s, b) for s in range(3) for b in range(18))
PATHS = tuple((name, ran) for name in BLOCKS for ran in (True, False))


def example(layers: tuple[int, int, int] = (18, 18, 18)) -> tuple[nn.Module, tuple]:
    # layers=(2, 2, 2): the same code with 6 gated blocks, for a quick test
    with seeded(0):
        model = BlockDrop110(layers).eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    # CIFAR-size images at random scales: the agent's logits, and so the 54 keep/drop
    # decisions, move with both the scale and the content
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        scale = float(torch.exp(torch.empty(()).uniform_(-1.0, 1.5, generator=g)))
        out.append((scale * torch.randn(1, 3, 32, 32, generator=g),))
    return out


def path_of(model: nn.Module, args: tuple) -> tuple:
    return blocks_ran(model, args, BLOCKS)
