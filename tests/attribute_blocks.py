"""A block that counts its own refinement steps on `self` (test_self_attributes.py's parent, in
another file, reads the count): nothing in this file reads `.refinements` except `self`."""
from __future__ import annotations

import torch
from torch import nn


class RefiningBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.refinements = 0

    def forward(self, x):
        self.refinements = 0
        while x.abs().sum() > 1.0 and self.refinements < 4:
            x = torch.tanh(self.fc(x)) * 0.7
            self.refinements += 1
        return x
