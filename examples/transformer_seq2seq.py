"""A small Transformer encoder-decoder with token embeddings, a padding mask and a causal mask."""
from __future__ import annotations

import math

import torch
import torch.nn as nn

VOCAB = 50
PAD = 0


class PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, max_len: int = 64):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pe[: x.size(1)]


class Seq2SeqTransformer(nn.Module):
    def __init__(self, vocab: int = VOCAB, d_model: int = 32, nhead: int = 4, ff: int = 64, layers: int = 1):
        super().__init__()
        self.d_model = d_model
        self.src_embed = nn.Embedding(vocab, d_model, padding_idx=PAD)
        self.tgt_embed = nn.Embedding(vocab, d_model, padding_idx=PAD)
        self.pos = PositionalEncoding(d_model)
        self.transformer = nn.Transformer(
            d_model=d_model,
            nhead=nhead,
            num_encoder_layers=layers,
            num_decoder_layers=layers,
            dim_feedforward=ff,
            dropout=0.1,
            batch_first=True,
        )
        self.generator = nn.Linear(d_model, vocab)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        src_pad = src == PAD
        t = tgt.size(1)
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=tgt.device), diagonal=1)
        scale = math.sqrt(self.d_model)
        out = self.transformer(
            self.pos(self.src_embed(src) * scale),
            self.pos(self.tgt_embed(tgt) * scale),
            tgt_mask=causal,
            tgt_is_causal=True,  # stated, so torch need not compare the mask with a causal one
            src_key_padding_mask=src_pad,
            memory_key_padding_mask=src_pad,
        )
        return self.generator(out)


def inputs(batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, VOCAB, (batch, 6), generator=g)
    lengths = torch.randint(2, 7, (batch,), generator=g)
    src[torch.arange(6)[None, :] >= lengths[:, None]] = PAD
    tgt = torch.randint(1, VOCAB, (batch, 5), generator=g)
    return src, tgt


def example() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return Seq2SeqTransformer().eval(), inputs(2)
