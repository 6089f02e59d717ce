"""Shallow-Deep Network (Kaya et al., ICML 2019): a ResNet with internal classifiers and early exit."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from examples.dynn import seeded


class InternalClassifier(nn.Module):
    # mixed max/avg pooling with a learned mixing weight, as in the SDN paper
    def __init__(self, channels, num_classes):
        super().__init__()
        self.max_pool = nn.AdaptiveMaxPool2d(1)
        self.avg_pool = nn.AdaptiveAvgPool2d(1)
        self.alpha = nn.Parameter(torch.rand(1))
        self.linear = nn.Linear(channels, num_classes)

    def forward(self, x):
        a = torch.sigmoid(self.alpha)
        mixed = a * self.max_pool(x) + (1 - a) * self.avg_pool(x)
        return self.linear(mixed.view(mixed.size(0), -1))


class BasicBlockWOutput(nn.Module):
    expansion = 1

    def __init__(self, in_channels, channels, add_output, num_classes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False), nn.BatchNorm2d(channels))
        self.output_id = add_output
        if add_output:
            self.output = InternalClassifier(channels, num_classes)
            self.no_output = False
        else:
            self.output = None
            self.no_output = True

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        fwd = F.relu(out + self.shortcut(x))
        # [features, is_output, internal prediction] -- the SDN block protocol
        if self.no_output:
            return [fwd, 0, None]
        return [fwd, 1, self.output(fwd)]


class ResNet_SDN(nn.Module):
    def __init__(self, num_classes=10, add_output=(1, 1, 1, 0), confidence_threshold=0.5):
        super().__init__()
        self.num_classes = num_classes
        self.add_output = list(add_output)
        self.num_output = sum(self.add_output) + 1
        self.confidence_threshold = confidence_threshold
        self.init_conv = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        widths = [16, 16, 32, 32]
        strides = [1, 1, 2, 1]
        layers = []
        in_channels = 16
        for i, (w, s) in enumerate(zip(widths, strides)):
            layers.append(BasicBlockWOutput(in_channels, w, self.add_output[i], num_classes, stride=s))
            in_channels = w
        self.layers = nn.ModuleList(layers)
        self.end_layers = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_channels, num_classes))
        self.initialize_weights()
        # inference runs the early-exit routine; training code calls train_forward explicitly
        self.forward = self.early_exit

    def initialize_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                m.weight.data.fill_(1)
                m.bias.data.zero_()
            elif isinstance(m, nn.Linear):
                m.weight.data.normal_(0, 0.3)
                m.bias.data.zero_()

    def train_forward(self, x):
        outputs = []
        fwd = self.init_conv(x)
        for layer in self.layers:
            fwd, is_output, output = layer(fwd)
            if is_output:
                outputs.append(output)
        outputs.append(self.end_layers(fwd))
        return outputs

    def early_exit(self, x):
        confidences = []
        outputs = []
        fwd = self.init_conv(x)
        output_id = 0
        for layer in self.layers:
            fwd, is_output, output = layer(fwd)
            if is_output:
                outputs.append(output)
                softmax = F.softmax(output[0], dim=0)
                confidence = torch.max(softmax)
                confidences.append(confidence)
                if confidence >= self.confidence_threshold:
                    is_early = True
                    return output, output_id, is_early
                output_id += is_output
        output = self.end_layers(fwd)
        outputs.append(output)
        softmax = F.softmax(output[0], dim=0)
        confidence = torch.max(softmax)
        confidences.append(confidence)
        # no internal classifier was confident enough: answer with the most confident one
        max_confidence_output = np.argmax(confidences)
        is_early = False
        return outputs[max_confidence_output], max_confidence_output, is_early


EXITS = 4
PATHS = tuple(("early", i) for i in range(EXITS - 1)) + (("fallback", "internal"), ("fallback", "final"))


def example() -> tuple[nn.Module, tuple]:
    with seeded(0):
        model = ResNet_SDN().eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    # Two image families at random scales: textured noise drives the max-pooled early
    # classifiers, flat colour patches the average-pooled deep ones; small scales are
    # unconfident everywhere and fall through to the most-confident fallback.
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        scale = float(torch.exp(torch.empty(()).uniform_(-1.2, 1.4, generator=g)))
        if i % 2 == 0:
            x = torch.randn(1, 3, 16, 16, generator=g)
        else:
            x = torch.randn(1, 3, 1, 1, generator=g) + 0.1 * torch.randn(1, 3, 16, 16, generator=g)
        out.append((x * scale,))
    return out


def path_of(model: nn.Module, args: tuple) -> tuple:
    with torch.no_grad():
        _, exit_id, is_early = model(*args)
    if is_early:
        return (("early", int(exit_id)),)
    return (("fallback", "final" if int(exit_id) == EXITS - 1 else "internal"),)
