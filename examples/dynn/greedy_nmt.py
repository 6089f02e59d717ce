"""Greedy Transformer translation, after Vaswani et al., *Attention Is All You Need*, NeurIPS 2017."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from examples.dynn import seeded

PAD, BOS, EOS = 0, 1, 2


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, max_len=32):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return x + self.pe[: x.size(1)]


class Seq2SeqTransformer(nn.Module):
    def __init__(self, src_vocab=16, tgt_vocab=16, d_model=32, nhead=4, dim_feedforward=64, max_len=7):
        super().__init__()
        self.d_model = d_model
        self.max_len = max_len
        self.src_tok_emb = nn.Embedding(src_vocab, d_model)
        self.tgt_tok_emb = nn.Embedding(tgt_vocab, d_model)
        self.positional_encoding = PositionalEncoding(d_model)
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout=0.0, batch_first=True),
            num_layers=1, enable_nested_tensor=False)
        self.decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(d_model, nhead, dim_feedforward, dropout=0.0, batch_first=True),
            num_layers=1)
        self.generator = nn.Linear(d_model, tgt_vocab)

    def encode(self, src, src_padding_mask):
        src_emb = self.positional_encoding(self.src_tok_emb(src) * math.sqrt(self.d_model))
        return self.encoder(src_emb, src_key_padding_mask=src_padding_mask)

    def forward(self, src):
        src_padding_mask = src == PAD
        memory = self.encode(src, src_padding_mask)
        batch_size = src.size(0)
        ys = torch.full((batch_size, 1), BOS, dtype=torch.long)
        finished = torch.zeros(batch_size, dtype=torch.bool)
        for i in range(self.max_len):
            tgt_mask = nn.Transformer.generate_square_subsequent_mask(ys.size(1))
            tgt_emb = self.positional_encoding(self.tgt_tok_emb(ys) * math.sqrt(self.d_model))
            out = self.decoder(tgt_emb, memory, tgt_mask=tgt_mask, memory_key_padding_mask=src_padding_mask)
            logits = self.generator(out)
            next_word = logits[:, -1].argmax(-1)
            # sentences that already produced <eos> only get padding
            next_word = next_word.masked_fill(finished, PAD)
            ys = torch.cat([ys, next_word.unsqueeze(1)], dim=1)
            finished |= next_word == EOS
            if finished.all():
                break
        return ys


BATCH = 2
SRC_LEN = 7
MAX_LEN = 7
# ys holds <bos> plus 1..MAX_LEN generated tokens (MAX_LEN + 1: cut off before both ended);
# with this init no batch over inputs(50) ends after exactly two tokens
PATHS = tuple(("length", k) for k in (2, 4, 5, 6, 7, MAX_LEN + 1))


def example() -> tuple[nn.Module, tuple]:
    # seed 117: with this init the decoded lengths vary widely with the source sentences
    with seeded(117):
        model = Seq2SeqTransformer(max_len=MAX_LEN).eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    # two source sentences of random length, <bos> w ... w <eos> then padding
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        lengths = torch.randint(3, SRC_LEN + 1, (BATCH, 1), generator=g)
        words = torch.randint(3, 16, (BATCH, SRC_LEN), generator=g)
        positions = torch.arange(SRC_LEN).unsqueeze(0)
        src = torch.where(positions < lengths, words, torch.full_like(words, PAD))
        src[:, 0] = BOS
        src[positions == lengths - 1] = EOS
        out.append((src,))
    return out


def path_of(model: nn.Module, args: tuple) -> tuple:
    with torch.no_grad():
        ys = model(*args)
    return (("length", ys.size(1)),)
