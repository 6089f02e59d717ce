"""Iterators (zip, enumerate, iter, generators) and dict views on the dispatch host: a region that
reads or makes one runs its statement as Python reads it, once, so a partly consumed iterator goes
on where it stopped; none is a compiled constant or keyed by its id. Parts that only move arrays
(`beams.append((score, toks, h))`) run as Python instead of a capture per float value. Compared
with the original torch model: floats within differential's 1e-4, ints exact."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dycl_jax
from differential import assert_same


class ReadNoTensor(nn.Module):
    """The region summing the zip takes no tensor: probing it as Python would consume the zip."""

    def forward(self, x):
        it = zip([1, 2], [3, 4])
        if x.sum().item() > -1e9:
            s = sum(a * b for a, b in it)
        return x * s


class MadeWithTensors(nn.Module):
    """The zip is made in a region with tensor work: a program would give one zip on every call."""

    def forward(self, x):
        y = x * 2
        it = zip([1, 2], [3, 4])
        if y.sum().item() > -1e9:
            s = 0
            for a, b in it:
                s += a * b
        return y * s


class PartlyConsumed(nn.Module):
    """A region takes one item with tensor work, the host loop takes the rest."""

    def forward(self, x):
        it = enumerate([3, 5, 7])
        if x.sum().item() > -1e9:
            k, v = next(it)
            y = x * v + k
        for k, v in it:
            y = y * k + v
        return y


class ViewOfData(nn.Module):
    """A dict view read after its dict changed, with values from the input's data."""

    def forward(self, x):
        d = {"a": int(x[0].item() > 0)}
        vals = d.values()
        if x.sum().item() > -1e9:
            d["b"] = 3
        return x * sum(vals)


class FreshZipPerStep(nn.Module):
    """A new zip at every step of a Python loop, read by a region with a tensor."""

    def forward(self, x):
        outs = []
        for k in range(4):
            it = zip(range(k, k + 2), range(1, 3))
            if x[0].item() > -100:
                outs.append(x * sum(a * b for a, b in it))
        return torch.stack(outs)


MODELS = [ReadNoTensor, MadeWithTensors, PartlyConsumed, ViewOfData, FreshZipPerStep]


@pytest.mark.parametrize("cls", MODELS, ids=lambda c: c.__name__)
def test_iterators_match_torch_and_compile_once(cls: type) -> None:
    model = cls().eval()
    inputs = [torch.tensor([1.5, -0.5]), torch.tensor([-2.0, 0.25])]
    jm = dycl_jax.to_jax(model, (inputs[0],), host="dispatch")
    for k, x in enumerate(inputs * 2):
        with torch.no_grad():
            want = model(x)
        assert_same(want, jm(x), f"{cls.__name__} input {k}")
        if k == 1:
            seen = (jm._fn.captures, jm._fn.compilations())
    assert (jm._fn.captures, jm._fn.compilations()) == seen, "a second call with seen shapes compiled again"


class Beams(nn.Module):
    """Beam-search bookkeeping: float scores and token lists travel with a hidden state in tuples."""

    def forward(self, x):
        h = torch.tanh(x)
        beams = [(0.0, [1], h)]
        for step in range(3):
            candidates = []
            for score, toks, h in beams:
                h = torch.tanh(h + step)
                for v in h[0, :2].tolist():
                    candidates.append((score + v, toks + [step], h))
            beams = sorted(candidates, key=lambda c: c[0], reverse=True)[:2]
        best_score, best, h = beams[0]
        return h, best_score, len(best)


def test_moving_arrays_is_not_a_capture_per_value() -> None:
    model = Beams().eval()
    inputs = [torch.randn(1, 3, generator=torch.Generator().manual_seed(k)) for k in range(3)]
    jm = dycl_jax.to_jax(model, (inputs[0],), host="dispatch")
    for k, x in enumerate(inputs):
        with torch.no_grad():
            want = model(x)
        assert_same(want, jm(x), f"input {k}")
        if k == 0:
            seen = jm._fn.captures
    # new scores (floats) at every call: the parts that only move `h` are not captured again
    assert jm._fn.captures == seen, (jm._fn.captures, seen)
