"""Shallow-Deep Network as in the published code (Kaya et al., ICML 2019): blocks return constant-built flag tensors."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from examples.dynn import seeded
# same classifier head, inputs and path labels as shallow_deep; only the block protocol differs
from examples.dynn.shallow_deep import EXITS, PATHS, InternalClassifier, inputs, path_of  # noqa: F401


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
        # features, is_output flag, internal prediction -- the flag is built as a tensor
        if self.no_output:
            return fwd, torch.tensor(0), None
        return fwd, torch.tensor(1), self.output(fwd)


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


def example() -> tuple[nn.Module, tuple]:
    with seeded(0):
        model = ResNet_SDN().eval()
    return model, inputs(1)[0]
