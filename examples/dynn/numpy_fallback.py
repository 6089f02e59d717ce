"""Early exit with a numpy argmax fallback, after Teerapittayanon et al., *BranchyNet*, ICPR 2016."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from examples.dynn import image_inputs, seeded


class ExitHead(nn.Module):
    def __init__(self, channels, num_classes):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x):
        return self.fc(self.pool(x).flatten(1))


class BranchyNet(nn.Module):
    def __init__(self, widths=(8, 16, 16), num_classes=10, threshold=0.5):
        super().__init__()
        self.threshold = threshold
        blocks, heads = [], []
        in_channels = 3
        for i, w in enumerate(widths):
            blocks.append(nn.Sequential(
                nn.Conv2d(in_channels, w, 3, stride=1 if i == 0 else 2, padding=1), nn.ReLU(),
                nn.Conv2d(w, w, 3, padding=1), nn.ReLU()))
            heads.append(ExitHead(w, num_classes))
            in_channels = w
        self.blocks = nn.ModuleList(blocks)
        self.heads = nn.ModuleList(heads)
        self.initialize_weights()

    def initialize_weights(self):
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                m.weight.data.normal_(0, 0.3)
                m.bias.data.zero_()

    def forward(self, x):
        outputs = []
        confidences = []
        for i, (block, head) in enumerate(zip(self.blocks, self.heads)):
            x = block(x)
            out = head(x)
            conf = F.softmax(out, dim=1).max()
            outputs.append(out)
            confidences.append(conf)
            if conf.item() > self.threshold:
                return out, i
        # nobody was sure: trust whichever head was the most confident
        best = np.argmax([c.item() for c in confidences])
        return outputs[best], best


NUM_EXITS = 3
THRESHOLD = 0.28
PATHS = tuple(("exit", i) for i in range(NUM_EXITS)) + tuple(("fallback", i) for i in range(NUM_EXITS))


def example() -> tuple[nn.Module, tuple]:
    # seed 21: with this init every head is confident for some inputs and the best of three for others
    with seeded(21):
        model = BranchyNet(threshold=THRESHOLD).eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    return image_inputs(n, seed, log_scale=(-0.5, 1.5))


def path_of(model: nn.Module, args: tuple) -> tuple:
    # an exit is taken only when its own answer is confident, a fallback only when none is
    with torch.no_grad():
        out, i = model(*args)
    confident = F.softmax(out, dim=1).max().item() > model.threshold
    return (("exit" if confident else "fallback", int(i)),)
