"""Teacher forcing as in a-PyTorch-Tutorial-to-Image-Captioning (Xu et al., *Show, Attend and Tell*, ICML 2015)."""

from __future__ import annotations

import torch
import torch.nn as nn

from examples.dynn import seeded
from examples.dynn.captioning import Attention


class DecoderWithAttention(nn.Module):
    def __init__(self, attention_dim=16, embed_dim=16, decoder_dim=32, vocab_size=20, encoder_dim=32):
        super().__init__()
        self.encoder_dim = encoder_dim
        self.vocab_size = vocab_size
        self.attention = Attention(encoder_dim, decoder_dim, attention_dim)
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.decode_step = nn.LSTMCell(embed_dim + encoder_dim, decoder_dim, bias=True)
        self.init_h = nn.Linear(encoder_dim, decoder_dim)
        self.init_c = nn.Linear(encoder_dim, decoder_dim)
        self.f_beta = nn.Linear(decoder_dim, encoder_dim)
        self.sigmoid = nn.Sigmoid()
        self.dropout = nn.Dropout(p=0.5)
        self.fc = nn.Linear(decoder_dim, vocab_size)

    def init_hidden_state(self, encoder_out):
        mean_encoder_out = encoder_out.mean(dim=1)
        return self.init_h(mean_encoder_out), self.init_c(mean_encoder_out)

    def forward(self, encoder_out, encoded_captions, caption_lengths):
        batch_size = encoder_out.size(0)
        encoder_dim = encoder_out.size(-1)
        vocab_size = self.vocab_size

        # flatten image
        encoder_out = encoder_out.view(batch_size, -1, encoder_dim)
        num_pixels = encoder_out.size(1)

        # sort input data by decreasing lengths
        caption_lengths, sort_ind = caption_lengths.squeeze(1).sort(dim=0, descending=True)
        encoder_out = encoder_out[sort_ind]
        encoded_captions = encoded_captions[sort_ind]

        embeddings = self.embedding(encoded_captions)
        h, c = self.init_hidden_state(encoder_out)

        # we won't decode at the <end> position, since we've finished generating as soon as we generate <end>
        decode_lengths = (caption_lengths - 1).tolist()

        predictions = torch.zeros(batch_size, max(decode_lengths), vocab_size)
        alphas = torch.zeros(batch_size, max(decode_lengths), num_pixels)

        # at each time-step, decode by attention-weighing the encoder's output based on the decoder's
        # previous hidden state output, then generate a new word with the previous word and the weighted encoding
        for t in range(max(decode_lengths)):
            batch_size_t = sum([l > t for l in decode_lengths])
            attention_weighted_encoding, alpha = self.attention(encoder_out[:batch_size_t], h[:batch_size_t])
            gate = self.sigmoid(self.f_beta(h[:batch_size_t]))
            attention_weighted_encoding = gate * attention_weighted_encoding
            h, c = self.decode_step(
                torch.cat([embeddings[:batch_size_t, t, :], attention_weighted_encoding], dim=1),
                (h[:batch_size_t], c[:batch_size_t]))
            preds = self.fc(self.dropout(h))
            predictions[:batch_size_t, t, :] = preds
            alphas[:batch_size_t, t, :] = alpha

        return predictions, encoded_captions, decode_lengths, alphas, sort_ind


BATCH = 4
MAX_CAPTION_LEN = 8
# max(decode_lengths) = longest caption in the batch minus its <end>
PATHS = tuple(("max_decode_length", k) for k in range(1, MAX_CAPTION_LEN))


def example() -> tuple[nn.Module, tuple]:
    with seeded(0):
        model = DecoderWithAttention().eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    # encoder features (4 images, 4x4 regions) and <start> ... <end> captions padded with 0;
    # each batch draws its own longest allowed length so short batches occur too
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        encoder_out = torch.randn(BATCH, 4, 4, 32, generator=g)
        longest = int(torch.randint(2, MAX_CAPTION_LEN + 1, (), generator=g))
        caption_lengths = torch.randint(2, longest + 1, (BATCH, 1), generator=g)
        words = torch.randint(3, 20, (BATCH, MAX_CAPTION_LEN), generator=g)
        positions = torch.arange(MAX_CAPTION_LEN).unsqueeze(0)
        captions = torch.where(positions < caption_lengths, words, torch.zeros_like(words))
        captions[:, 0] = 1
        captions[positions == caption_lengths - 1] = 2
        out.append((encoder_out, captions, caption_lengths))
    return out


def path_of(model: nn.Module, args: tuple) -> tuple:
    with torch.no_grad():
        _, _, decode_lengths, _, _ = model(*args)
    return (("max_decode_length", max(decode_lengths)),)
