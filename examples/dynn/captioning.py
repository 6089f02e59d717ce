"""Greedy attention captioning, after Xu et al., *Show, Attend and Tell*, ICML 2015."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from examples.dynn import image_inputs, seeded


class Encoder(nn.Module):
    # a small CNN standing in for the ResNet trunk: 16x16 image -> 4x4 = 16 regions
    def __init__(self, encoder_dim=32):
        super().__init__()
        self.convs = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(16, encoder_dim, 3, stride=2, padding=1), nn.ReLU())

    def forward(self, images):
        out = self.convs(images)  # (N, encoder_dim, 4, 4)
        return out.permute(0, 2, 3, 1).flatten(1, 2)  # (N, num_pixels, encoder_dim)


class Attention(nn.Module):
    def __init__(self, encoder_dim, decoder_dim, attention_dim):
        super().__init__()
        self.encoder_att = nn.Linear(encoder_dim, attention_dim)
        self.decoder_att = nn.Linear(decoder_dim, attention_dim)
        self.full_att = nn.Linear(attention_dim, 1)

    def forward(self, encoder_out, decoder_hidden):
        att1 = self.encoder_att(encoder_out)
        att2 = self.decoder_att(decoder_hidden)
        att = self.full_att(F.relu(att1 + att2.unsqueeze(1))).squeeze(2)
        alpha = F.softmax(att, dim=1)
        return (encoder_out * alpha.unsqueeze(2)).sum(dim=1), alpha


class CaptionModel(nn.Module):
    def __init__(self, vocab_size=20, embed_dim=16, decoder_dim=32, attention_dim=16, encoder_dim=32,
                 start_token=1, end_token=2, max_len=7):
        super().__init__()
        self.start_token = start_token
        self.end_token = end_token
        self.max_len = max_len
        self.encoder = Encoder(encoder_dim)
        self.attention = Attention(encoder_dim, decoder_dim, attention_dim)
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.decode_step = nn.LSTMCell(embed_dim + encoder_dim, decoder_dim)
        self.init_h = nn.Linear(encoder_dim, decoder_dim)
        self.init_c = nn.Linear(encoder_dim, decoder_dim)
        self.f_beta = nn.Linear(decoder_dim, encoder_dim)
        self.fc = nn.Linear(decoder_dim, vocab_size)
        # image-conditioned length prior: busy images get longer captions
        self.end_bias = nn.Linear(encoder_dim, 1)

    def init_hidden_state(self, encoder_out):
        mean_encoder_out = encoder_out.mean(dim=1)
        return self.init_h(mean_encoder_out), self.init_c(mean_encoder_out)

    def forward(self, images):
        encoder_out = self.encoder(images)
        h, c = self.init_hidden_state(encoder_out)
        end_bias = self.end_bias(encoder_out.mean(dim=1))
        seqs = torch.full((1, 1), self.start_token, dtype=torch.long)
        word = seqs[:, 0]
        alphas = []
        step = 1
        while True:
            embeddings = self.embedding(word)
            awe, alpha = self.attention(encoder_out, h)
            gate = torch.sigmoid(self.f_beta(h))
            awe = gate * awe
            h, c = self.decode_step(torch.cat([embeddings, awe], dim=1), (h, c))
            scores = F.log_softmax(self.fc(h), dim=1)
            scores[:, self.end_token] += end_bias[:, 0]
            word = scores.argmax(dim=1)
            seqs = torch.cat([seqs, word.unsqueeze(1)], dim=1)
            alphas.append(alpha)
            if word.item() == self.end_token or step >= self.max_len:
                break
            step += 1
        return seqs, torch.stack(alphas, dim=1)


MAX_LEN = 7
# seqs holds <start> plus 1..MAX_LEN generated words; MAX_LEN + 1 is the cutoff without <end>
PATHS = tuple(("length", k) for k in range(2, MAX_LEN + 2))


def example() -> tuple[nn.Module, tuple]:
    # seed 186: with this init every caption length, up to the max_len cutoff, occurs
    with seeded(186):
        model = CaptionModel(max_len=MAX_LEN).eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    return image_inputs(n, seed)


def path_of(model: nn.Module, args: tuple) -> tuple:
    with torch.no_grad():
        seqs, _ = model(*args)
    return (("length", seqs.size(1)),)
