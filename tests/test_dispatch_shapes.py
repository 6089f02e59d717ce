"""Data-dependent shapes and host values under the dispatch host, in several research-code
styles; every case against the ORIGINAL torch module on inputs that take each path."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.utils._pytree as pytree

import dycl_jax
from differential import assert_same  # pytest puts tests/ on sys.path


class MaskedSelect(nn.Module):
    """Boolean-mask indexing and assignment, and `numel()` of the selection returned."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        mask = h[:, 0] > 0
        pos = h[mask]
        out = h.clone()
        out[mask] = pos * 2
        return out, pos, pos.numel()


class ItemAsBound(nn.Module):
    """`.item()` as a slice bound and as a loop count; `tensor_split` at computed points."""

    def forward(self, x, n):
        k = int(n.item())
        head = x[:k]
        acc = torch.zeros(x.shape[1])
        for _ in range(int(n.item())):
            acc = acc + head.sum(0)
        cut = int((x[:, 0] > 0).sum())
        parts = torch.tensor_split(x, [cut])
        return head, acc, [p.shape[0] for p in parts]


class PythonTokens(nn.Module):
    """Greedy decoding into a Python list of ints, turned into a tensor at the end."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.emb = nn.Embedding(8, 8)
        self.cell = nn.GRUCell(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, h):
        tokens = []
        tok = torch.zeros(1, dtype=torch.long)
        for _ in range(6):
            h = self.cell(self.emb(tok), h)
            tok = self.out(h).argmax(-1)
            if tok.item() == 0:
                break
            tokens.append(tok.item())
        return torch.tensor(tokens, dtype=torch.long), h


class GrowWhileAll(nn.Module):
    """A `while` whose carried tensor grows by `torch.cat`, stopping on `.all()` of a mask."""

    def forward(self, x):
        seq = x[:, :1]
        while not (seq.sum(1) > 2).all() and seq.shape[1] < 8:
            seq = torch.cat([seq, seq[:, -1:] * 1.5 + 0.1], dim=1)
        return seq


class EmptyOrNot(nn.Module):
    """An output list that is empty on one path; an in-place row update."""

    def forward(self, x):
        found = []
        y = x.clone()
        for i in range(x.shape[0]):
            if x[i].mean() > 0:
                found.append(x[i])
                y[i] += 1
        return found, y


def _inputs(name: str) -> list[tuple]:
    g = torch.Generator().manual_seed(0)
    if name == "masked":
        return [(torch.randn(5, 4, generator=g),) for _ in range(6)] + [(-torch.ones(5, 4) * 9,)]
    if name == "bound":
        return [(torch.randn(6, 3, generator=g), torch.tensor(k)) for k in (0, 2, 5)]
    if name == "tokens":
        return [(torch.randn(1, 8, generator=g) * 3,) for _ in range(8)]
    if name == "grow":
        return [(torch.rand(2, 3, generator=g) * s,) for s in (0.1, 1.0, 3.0)]
    return [(torch.randn(3, 2, generator=g),) for _ in range(6)]


CASES = {"masked": MaskedSelect, "bound": ItemAsBound, "tokens": PythonTokens, "grow": GrowWhileAll,
         "empty": EmptyOrNot}



PADDED = {"grow", "tokens"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_auto_matches_torch_exactly(name: str) -> None:
    model = CASES[name]().eval()
    inputs = _inputs(name)
    jm = dycl_jax.to_jax(model, inputs[0])
    # decode loops that a Python bound ends within 16 steps stage as one padded program (trimmed per call)
    if name in PADDED:
        assert jm.host == "staged" and jm.unroll is not None and jm.report().padded_reason
    else:
        assert jm.host == "dispatch", jm.report().dispatch_reason
    shapes = set()
    for k, args in enumerate(inputs):
        with torch.no_grad():
            want = model(*args)
        got = jm(*args)
        assert_same(want, got, f"{name} input {k}", rtol=1e-5, atol=1e-5)
        shapes.add(str([np.shape(v) for v in pytree.tree_leaves(got)]))
    assert len(shapes) > 1, f"{name}: every input gave the same output shapes; the test would not see a padding bug"
