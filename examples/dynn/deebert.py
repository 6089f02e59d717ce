"""DeeBERT (Xin et al., ACL 2020): a Transformer encoder with entropy-gated off-ramps after each layer."""

from __future__ import annotations

import torch
import torch.nn as nn

from examples.dynn import seeded


def entropy(x):
    """Entropy of the softmax of pre-softmax logits, per row."""
    exp_x = torch.exp(x)
    A = torch.sum(exp_x, dim=1)  # sum of exp(x_i)
    B = torch.sum(x * exp_x, dim=1)  # sum of x_i * exp(x_i)
    return torch.log(A) - B / A


class BertEmbeddings(nn.Module):
    def __init__(self, vocab_size, hidden_size, max_position):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab_size, hidden_size)
        self.position_embeddings = nn.Embedding(max_position, hidden_size)
        self.LayerNorm = nn.LayerNorm(hidden_size, eps=1e-12)

    def forward(self, input_ids):
        seq_length = input_ids.size(1)
        position_ids = torch.arange(seq_length, dtype=torch.long, device=input_ids.device)
        position_ids = position_ids.unsqueeze(0).expand_as(input_ids)
        embeddings = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        return self.LayerNorm(embeddings)


class BertPooler(nn.Module):
    def __init__(self, hidden_size):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states):
        # "pool" by taking the hidden state of the first token
        return self.activation(self.dense(hidden_states[:, 0]))


class BertHighway(nn.Module):
    """An off-ramp: pooler + classifier on an intermediate layer's output."""

    def __init__(self, hidden_size, num_labels):
        super().__init__()
        self.pooler = BertPooler(hidden_size)
        self.dropout = nn.Dropout(0.1)
        self.classifier = nn.Linear(hidden_size, num_labels)

    def forward(self, hidden_states):
        pooled_output = self.dropout(self.pooler(hidden_states))
        return self.classifier(pooled_output)


class DeeBertForSequenceClassification(nn.Module):
    def __init__(self, vocab_size=64, hidden_size=32, num_layers=4, num_heads=4, intermediate_size=64,
                 max_position=16, num_labels=3, initializer_range=0.4):
        super().__init__()
        self.initializer_range = initializer_range
        self.num_layers = num_layers
        self.embeddings = BertEmbeddings(vocab_size, hidden_size, max_position)
        self.layer = nn.ModuleList([
            nn.TransformerEncoderLayer(hidden_size, num_heads, intermediate_size, dropout=0.1,
                                       activation="gelu", batch_first=True)
            for _ in range(num_layers)])
        # one off-ramp per layer except the last, which has the regular classifier
        self.highway = nn.ModuleList([BertHighway(hidden_size, num_labels) for _ in range(num_layers - 1)])
        self.final = BertHighway(hidden_size, num_labels)
        # disabled (-1) until set_early_exit_entropy is called
        self.early_exit_entropy = [-1 for _ in range(num_layers - 1)]
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=self.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.data.zero_()

    def set_early_exit_entropy(self, x):
        if isinstance(x, (float, int)):
            for i in range(len(self.early_exit_entropy)):
                self.early_exit_entropy[i] = x
        else:
            self.early_exit_entropy = list(x)

    def forward(self, input_ids):
        hidden_states = self.embeddings(input_ids)
        for i, layer_module in enumerate(self.layer):
            hidden_states = layer_module(hidden_states)
            if i == self.num_layers - 1:
                break
            highway_logits = self.highway[i](hidden_states)
            if not self.training:
                highway_entropy = entropy(highway_logits)
                if highway_entropy < self.early_exit_entropy[i]:
                    # leave through off-ramp i; layers are counted from 1
                    return highway_logits, i + 1
        logits = self.final(hidden_states)
        return logits, self.num_layers


NUM_LAYERS = 4
PATHS = tuple(("exit_layer", k) for k in range(1, NUM_LAYERS + 1))


def example() -> tuple[nn.Module, tuple]:
    with seeded(0):
        model = DeeBertForSequenceClassification(num_layers=NUM_LAYERS)
    model.set_early_exit_entropy([0.7, 0.65, 0.75])
    return model.eval(), inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    # half the sequences are uniform random tokens, half repeat a few tokens: the two
    # families give the off-ramps very different confidence
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        if i % 2 == 0:
            ids = torch.randint(0, 64, (1, 8), generator=g)
        else:
            few = torch.randint(0, 64, (2,), generator=g)
            ids = few[torch.randint(0, 2, (1, 8), generator=g)]
        out.append((ids,))
    return out


def path_of(model: nn.Module, args: tuple) -> tuple:
    with torch.no_grad():
        _, exit_layer = model(*args)
    return (("exit_layer", int(exit_layer)),)
