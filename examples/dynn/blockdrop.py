"""BlockDrop (Wu et al., CVPR 2018): a policy network picks, per input, which residual blocks to run."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from examples.dynn import blocks_ran, image_inputs, seeded


def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    # residual connection is added by the caller, which may drop the block entirely
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return self.bn2(self.conv2(out))


class DownsampleB(nn.Module):
    # parameter-free shortcut: average-pool then pad channels with zeros
    def __init__(self, nIn, nOut, stride):
        super().__init__()
        self.avg = nn.AvgPool2d(stride)
        self.expand_ratio = nOut // nIn

    def forward(self, x):
        x = self.avg(x)
        return torch.cat([x] + [x.mul(0)] * (self.expand_ratio - 1), 1)


class FlatResNet(nn.Module):
    def __init__(self, layer_config=(2, 2, 2), num_classes=10):
        super().__init__()
        self.layer_config = list(layer_config)
        self.inplanes = 8
        self.seed = nn.Sequential(conv3x3(3, 8), nn.BatchNorm2d(8), nn.ReLU())
        blocks, ds = [], []
        for planes, n, stride in zip((8, 16, 32), layer_config, (1, 2, 2)):
            if stride != 1 or self.inplanes != planes:
                ds.append(DownsampleB(self.inplanes, planes, stride))
            else:
                ds.append(nn.Sequential())
            segment = []
            for b in range(n):
                segment.append(BasicBlock(self.inplanes, planes, stride if b == 0 else 1))
                self.inplanes = planes
            blocks.append(nn.ModuleList(segment))
        self.blocks = nn.ModuleList(blocks)
        self.ds = nn.ModuleList(ds)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)

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
        return self.fc(x)


class Policy(nn.Module):
    def __init__(self, num_blocks):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1),
            nn.AdaptiveAvgPool2d(1))
        self.logit = nn.Linear(16, num_blocks)
        # unbiased start: every block begins with an even chance of being kept
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.features(x).view(x.size(0), -1)
        return torch.sigmoid(self.logit(x))


class BlockDrop(nn.Module):
    def __init__(self, layer_config=(2, 2, 2), num_classes=10):
        super().__init__()
        self.agent = Policy(sum(layer_config))
        self.rnet = FlatResNet(layer_config, num_classes)

    def forward(self, inputs):
        probs = self.agent(inputs)
        # test time: deterministic policy
        policy = (probs > 0.5).float()
        preds = self.rnet(inputs, policy)
        return preds, policy


BLOCKS = tuple("rnet.blocks.{}.{}".format(s, b) for s in range(3) for b in range(2))
PATHS = tuple((name, ran) for name in BLOCKS for ran in (True, False))


def example() -> tuple[nn.Module, tuple]:
    # seed 8: with this init the policy keeps and drops every block for some inputs
    with seeded(8):
        model = BlockDrop().eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    return image_inputs(n, seed, log_scale=(-1.0, 1.5), texture=0.5, noise_every_other=False)


def path_of(model: nn.Module, args: tuple) -> tuple:
    return blocks_ran(model, args, BLOCKS)
