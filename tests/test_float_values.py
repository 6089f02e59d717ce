"""Python floats a region takes (`x * score` with `score` summed from `.item()` values, a
temperature argument). A region's program holds them as constants, so a float new at every call
compiled a program at every call (about 300 ms a call for a three-block model, and a cache entry
per call without end). Now a region part whose programs differ only in float values compiles a
value on its second sight (the first runs the part on the host) and at most
`specialised.PROGRAMS` of them; Python statements (`label = f"{score:.2f}"`) and parts that only
move arrays run as Python at any new value without a cache entry. Every call matches torch."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import dycl_jax
from differential import assert_same
from dycl_jax.host import dispatch


class RunningScore(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        score = 0.0
        for block in self.blocks:
            x = torch.tanh(block(x))
            score = score + x.max().item()
            label = f"{score:.2f}"
            x = x * score
        return x, score, len(label)


class Temperature(nn.Module):
    """A temperature read from the input (two values), dividing the logits in a region."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        temperature = 0.5 + float(x.abs().max().item() > 1.2)
        logits = self.fc(x) / temperature
        if logits.max() > 0.5:
            logits = logits - logits.max()
        return torch.softmax(logits, -1), logits.argmax(-1), temperature


def _x(k: int) -> torch.Tensor:
    return torch.randn(1, 4, generator=torch.Generator().manual_seed(k))


def _size(jm) -> tuple[int, int]:
    host = jm._fn
    return host.captures, sum(len(p.cache) for st in host.regions.values() for p in st.parts)


def test_a_float_new_at_every_call_compiles_nothing_more(monkeypatch):
    monkeypatch.setattr(dispatch, "DIRECT_ENTRIES", 0)  # (no short-way entries for values met again)
    torch.manual_seed(0)
    model = RunningScore().eval()
    jm = dycl_jax.to_jax(copy.deepcopy(model), (_x(0),), host="dispatch")
    sizes = []
    with torch.no_grad():
        for k in range(30):
            assert_same(model(_x(k)), jm(_x(k)), f"input {k}")
            sizes.append(_size(jm))
    assert sizes[-1] == sizes[4], f"(captures, cache entries) after 5 calls {sizes[4]}, after 30 {sizes[-1]}"


@pytest.mark.parametrize("host", ["auto", "dispatch"])
def test_a_float_seen_again_runs_one_program(host):
    torch.manual_seed(0)
    model = Temperature().eval()
    jm = dycl_jax.to_jax(copy.deepcopy(model), (_x(0),), host=host)
    temps = set()
    with torch.no_grad():
        for k in range(12):
            want = model(_x(k))
            assert_same(want, jm(_x(k)), f"input {k}")
            temps.add(want[2])
        assert temps == {0.5, 1.5}, temps
        if jm.host == "dispatch":
            seen = _size(jm)
            for k in range(12, 40):
                assert_same(model(_x(k)), jm(_x(k)), f"input {k}")
            assert _size(jm) == seen, f"{seen} -> {_size(jm)}"
            compiled = [e for st in jm._fn.regions.values() for p in st.parts for e in p.cache.values()
                        if type(e).__name__ == "Compiled"]
            assert len(compiled) >= 2, compiled  # one program per temperature
