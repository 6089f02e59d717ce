"""A text classifier: Embedding, 2-layer bidirectional LSTM, masked mean pooling, Linear."""
from __future__ import annotations

import torch
import torch.nn as nn

VOCAB = 100
PAD = 0


class LSTMClassifier(nn.Module):
    def __init__(self, vocab_size: int = VOCAB, embed_dim: int = 16, hidden: int = 16, num_classes: int = 4):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=PAD)
        self.lstm = nn.LSTM(embed_dim, hidden, num_layers=2, bidirectional=True, batch_first=True, dropout=0.1)
        self.fc = nn.Linear(4 * hidden, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        mask = (tokens != PAD).unsqueeze(-1).float()
        emb = self.embedding(tokens)
        out, (h_n, _) = self.lstm(emb)
        # mean of the outputs over real tokens, plus the last layer's final states
        pooled = (out * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        final = torch.cat([h_n[-2], h_n[-1]], dim=-1)
        return self.fc(torch.cat([pooled, final], dim=-1))


def inputs(batch: int, seed: int = 0) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, VOCAB, (batch, 5), generator=g)
    lengths = torch.randint(2, 6, (batch,), generator=g)
    tokens[torch.arange(5)[None, :] >= lengths[:, None]] = PAD  # right padding
    return (tokens,)


def example() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return LSTMClassifier().eval(), inputs(2)
