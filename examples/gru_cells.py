"""A sequence tagger mixing nn.GRU with an unrolled LSTMCell/GRUCell decoder."""
from __future__ import annotations

import torch
import torch.nn as nn


class GRUCellTagger(nn.Module):
    def __init__(self, in_features: int = 12, hidden: int = 16, num_tags: int = 5):
        super().__init__()
        self.encoder = nn.GRU(in_features, hidden, batch_first=True)
        self.lstm_cell = nn.LSTMCell(hidden, hidden)
        self.gru_cell = nn.GRUCell(hidden, hidden)
        self.out = nn.Linear(2 * hidden, num_tags)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        enc, h = self.encoder(x)
        h_l = h[0]
        c_l = torch.zeros_like(h_l)
        h_g = h[0]
        logits = []
        for t in range(x.size(1)):
            h_l, c_l = self.lstm_cell(enc[:, t], (h_l, c_l))
            h_g = self.gru_cell(enc[:, t] + h_l, h_g)
            logits.append(self.out(torch.cat([h_l, h_g], dim=-1)))
        return torch.stack(logits, dim=1)


def inputs(batch: int, seed: int = 0) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, 4, 12, generator=g),)


def example() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return GRUCellTagger().eval(), inputs(2)
