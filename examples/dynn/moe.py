"""Top-1 mixture-of-experts token classifier, after Fedus et al., *Switch Transformers*, JMLR 2022."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from examples.dynn import count_calls, seeded


class Expert(nn.Module):
    def __init__(self, d_model, hidden):
        super().__init__()
        self.fc1 = nn.Linear(d_model, hidden)
        self.fc2 = nn.Linear(hidden, d_model)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class SwitchLayer(nn.Module):
    # experts of different widths: routing decides how much compute a token gets
    def __init__(self, d_model=16, expert_hidden=(8, 16, 32, 64)):
        super().__init__()
        self.gate = nn.Linear(d_model, len(expert_hidden), bias=False)
        self.experts = nn.ModuleList([Expert(d_model, h) for h in expert_hidden])

    def forward(self, tokens):
        probs = F.softmax(self.gate(tokens), dim=-1)
        w, expert_idx = probs.max(-1)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            sel = (expert_idx == e).nonzero(as_tuple=True)[0]
            if sel.numel() == 0:
                continue
            out[sel] = expert(tokens[sel]) * w[sel, None]
        return out


class MoETokenClassifier(nn.Module):
    def __init__(self, d_model=16, num_labels=5):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.moe = SwitchLayer(d_model)
        self.classifier = nn.Linear(d_model, num_labels)

    def forward(self, x):
        batch_size, seq_len, d_model = x.shape
        tokens = x.reshape(-1, d_model)
        tokens = tokens + self.moe(self.norm(tokens))
        return self.classifier(tokens).view(batch_size, seq_len, -1)


NUM_EXPERTS = 4
EXPERTS = tuple("moe.experts.{}".format(e) for e in range(NUM_EXPERTS))
PATHS = tuple(("empty_expert", e) for e in range(NUM_EXPERTS)) + (("all_experts_used",),)


def example() -> tuple[nn.Module, tuple]:
    with seeded(0):
        model = MoETokenClassifier().eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    # a shared per-sentence offset of random strength pulls the tokens towards one expert
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        strength = float(torch.empty(()).uniform_(0.0, 2.0, generator=g))
        offset = torch.randn(1, 1, 16, generator=g) * strength
        out.append((offset + torch.randn(1, 12, 16, generator=g),))
    return out


def path_of(model: nn.Module, args: tuple) -> tuple:
    with torch.no_grad(), count_calls(model, list(EXPERTS)) as calls:
        model(*args)
    empty = tuple(("empty_expert", e) for e, name in enumerate(EXPERTS) if calls[name] == 0)
    return empty or (("all_experts_used",),)
