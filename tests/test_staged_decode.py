"""Decode loops staged on request (`to_jax(..., max_len=N)`): one XLA program whose outputs,
trimmed to their lengths, equal the ORIGINAL torch model's on every output length; the padded
form with its lengths; research-style loop variants; the exceeded bound; the refusals."""
from __future__ import annotations

from functools import lru_cache

import jax
import numpy as np
import pytest
import torch
import torch.nn as nn
from flax import nnx

import dycl_jax
from dycl_jax.errors import DecodeBoundError, DyclError
from dycl_jax.rewrite.padding import Decoded, Padded
from dycl_jax.runtime.decoded import trimmed
from examples.dynn import load
from differential import assert_same  # pytest puts tests/ on sys.path

N_INPUTS = 50


@lru_cache(maxsize=None)
def _converted(name: str, max_len: int, **kwargs):
    model, args = load(name).example()
    return model, dycl_jax.to_jax(model, args, host="staged", max_len=max_len, **kwargs)


def _one_program(jm, args: tuple) -> None:
    """The whole call is one jitted XLA program: no dispatch host, no host callbacks."""
    assert jm.host == "staged"
    text = jm._call.lower(jm._state_values(), jm.signature.bind(args)).as_text()
    assert "callback" not in text


def _check_padded(dec, want: tuple, shapes: list[tuple]) -> None:
    """The padded form: lengths are torch's shapes, the values agree inside them, zeros outside."""
    assert isinstance(dec, Decoded) and not bool(np.asarray(dec.exceeded))
    leaves = dec.value if isinstance(dec.value, tuple) else (dec.value,)
    assert len(leaves) == len(want)
    for i, (leaf, w) in enumerate(zip(leaves, want)):
        if not isinstance(leaf, Padded):
            assert_same(w, leaf, f"leaf {i}")
            continue
        assert tuple(np.asarray(leaf.value).shape) == shapes[i]
        assert tuple(np.asarray(leaf.lengths)) == tuple(w.shape)
        assert_same(w, trimmed(leaf), f"padded leaf {i}")
        value = np.asarray(leaf.value).copy()
        value[tuple(slice(0, n) for n in w.shape)] = 0
        assert not value.any(), f"leaf {i}: padding is not zero"


@pytest.mark.parametrize("name, max_len, kwargs, padded_shapes", [
    ("captioning", 7, {}, [(1, 8), (1, 7, 16)]),
    # the examples' inputs all have two sentences; a fixed batch halves the export time here
    ("greedy_nmt", 7, {"dynamic_batch": False}, [(2, 8)]),
])
def test_example_is_one_program_and_matches_torch(name, max_len, kwargs, padded_shapes) -> None:
    mod = load(name)
    model, jm = _converted(name, max_len, **kwargs)
    inputs = mod.inputs(N_INPUTS)
    _one_program(jm, inputs[0])
    assert any("at most 7 iterations" in u for u in jm.report().unrolled), jm.report().unrolled
    seen = set()
    for k, args in enumerate(inputs):
        with torch.no_grad():
            want = model(*args)
        want = want if isinstance(want, tuple) else (want,)
        got = jm(*args)
        assert_same(want, got if isinstance(got, tuple) else (got,), f"{name} input {k}")
        seen.add(("length", want[0].size(1)))  # the examples' path_of, without running torch again
        if k < 10:
            _check_padded(jm.padded(*args), want, padded_shapes)
    assert seen == set(mod.PATHS), sorted(seen)
    assert jm._call._cache_size() == 1  # every input ran the one compiled program


# ---------------------------------------------------------------- research-style variants

class ForBreak(nn.Module):
    """A `for` over a static range with a `.item()` break; what follows reads the grown sequence."""

    def __init__(self):
        super().__init__()
        self.emb, self.cell, self.out = nn.Embedding(3, 8), nn.GRUCell(8, 8), nn.Linear(8, 3)
        self.steps = 5

    def forward(self, h):
        tok = torch.zeros(1, dtype=torch.long)
        seq = tok.unsqueeze(0)
        logits = []
        for t in range(self.steps):
            h = self.cell(self.emb(tok), h)
            lg = self.out(h)
            logits.append(lg)
            tok = lg.argmax(-1)
            seq = torch.cat([seq, tok.unsqueeze(1)], dim=1)
            if tok.item() == 1:
                break
        n = seq.size(1)
        return seq, torch.stack(logits, dim=1), seq.sum() * n, n, t


class WhileStep(nn.Module):
    """`while True` bounded by a Python step count; outputs appended to a list, cat after the loop."""

    def __init__(self, max_steps=4):
        super().__init__()
        self.inp, self.rec = nn.Linear(4, 4), nn.Linear(4, 4)
        self.max_steps = max_steps

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        out = []
        step = 1
        while True:
            h = torch.tanh(self.rec(h))
            out.append(h)
            if h.mean().item() > 0.17 or step >= self.max_steps:
                break
            step += 1  # after the exit test, as in captioning: a Python counter on one path only
        stacked = torch.cat(out, 0)
        return stacked, stacked.mean(0), torch.tensor(step)


class EarlyReturn(nn.Module):
    """An early `return` inside the loop, a different value after it; the loop name reused."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(3, 3)
        self.threshold = 1.42

    def forward(self, x):
        ys = x
        for i in range(4):
            y = torch.sigmoid(self.l(ys[-1:]))
            ys = torch.cat([ys, y], 0)
            if y.sum() > self.threshold:
                return ys, ys.shape[0] + 100
        for i in range(2):  # a static loop after it, reusing the name
            ys = ys * 0.5
        return ys, i


class Unbounded(nn.Module):
    """`while True` with only a tensor exit: max_len bounds it."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(2, 2)

    def forward(self, x, limit):
        acc = x
        total = x.sum()
        while True:
            x = torch.tanh(self.l(x)) + 0.5
            acc = torch.cat([acc, x], 0)
            total = total + x.sum()
            if total > limit:
                break
        return acc


def _variant(cls, args, max_len, **kwargs):
    torch.manual_seed(0)
    model = cls(**kwargs).eval()
    return model, dycl_jax.to_jax(model, args, host="staged", max_len=max_len)


@pytest.mark.parametrize("cls, make, max_len, min_lengths", [
    (ForBreak, lambda g: (torch.randn(1, 8, generator=g) * 2,), 5, 3),
    (WhileStep, lambda g: (torch.randn(1, 4, generator=g),), 6, 3),
    (EarlyReturn, lambda g: (torch.rand(1, 3, generator=g) * 2 - 0.5,), 4, 3),
])
def test_variants_match_torch(cls, make, max_len, min_lengths) -> None:
    g = torch.Generator().manual_seed(1)
    inputs = [make(g) for _ in range(30)]
    model, jm = _variant(cls, inputs[0], max_len)
    assert jm.host == "staged"
    lengths = set()
    for k, args in enumerate(inputs):
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*args), f"{cls.__name__} input {k}")
        lengths.add(tuple(want[0].shape))
    assert len(lengths) >= min_lengths, lengths


def test_python_bound_needs_no_exceeded_branch_and_padded_form_under_jit_and_vmap() -> None:
    x = torch.randn(1, 4)
    model, jm = _variant(WhileStep, (x,), 50)
    # the Python bound (4 steps) ends the unrolling, not max_len: one tanh per step, plus the input's
    tanh = sum(n for op, n in jm.report().op_counts.items() if "tanh" in op)
    assert tanh == model.max_steps + 1, jm.report().op_counts
    assert not bool(np.asarray(jm.padded(x).exceeded))
    state = nnx.state(jm.module)
    xs = np.random.default_rng(0).standard_normal((6, 1, 4)).astype(np.float32)
    batched = jax.jit(jax.vmap(lambda xi: jm.apply(state, xi)))(xs)
    for i in range(6):
        with torch.no_grad():
            want = model(torch.from_numpy(xs[i]))
        one = jax.tree_util.tree_map(lambda a, i=i: a[i], batched)
        got = tuple(trimmed(v) if isinstance(v, Padded) else v for v in one.value)
        assert_same(want, got, f"vmapped input {i}")


def test_exceeded_bound_raises_located_error() -> None:
    x = torch.full((1, 2), 0.1)
    model, jm = _variant(Unbounded, (x, torch.tensor(3.0)), 3)
    iterations = set()
    for limit in np.linspace(0.0, 8.0, 17):
        with torch.no_grad():
            want = model(x, torch.tensor(limit))
        n = want.shape[0] - 1
        iterations.add(n)
        if n <= 3:  # within the bound: exact
            assert_same(want, jm(x, torch.tensor(limit)), f"limit {limit}")
            continue
        with pytest.raises(DecodeBoundError) as info:
            jm(x, torch.tensor(limit))
    assert {1, 2, 3} <= iterations and max(iterations) > 3, iterations
    err = info.value
    assert err.location.file.endswith("test_staged_decode.py") and "while True" in err.location.code
    assert "max_len=3" in str(err) and "max_len" in err.fix and 'host="auto"' in err.fix
    dec = jm.padded(x, torch.tensor(100.0))
    assert bool(np.asarray(dec.exceeded))


class NestedInWith(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(2, 2)

    def forward(self, x):
        seq = x
        with torch.no_grad():
            while seq.sum() < 3:  # each step adds more than 1
                seq = torch.cat([seq, torch.sigmoid(self.l(seq[-1:])) + 0.5], 0)
        return seq


def test_loop_inside_another_statement_is_refused_and_auto_dispatches() -> None:
    model = NestedInWith().eval()
    x = torch.zeros(1, 2)
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(model, (x,), host="staged", max_len=4)
    err = info.value
    assert err.location is not None and err.location.file.endswith("test_staged_decode.py")
    assert "while seq.sum() < 3" in err.location.code and "with" in str(err) and 'host="auto"' in err.fix
    jm = dycl_jax.to_jax(model, (x,), max_len=4)
    assert jm.host == "dispatch"
    with torch.no_grad():
        assert_same(model(x), jm(x), "dispatch")
