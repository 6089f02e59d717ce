"""Counted `while` loops (converters/counted_while.py): the ones the rewrite turns into a static
`for` stage as one program; the ones it must leave alone still convert; every case against the
ORIGINAL torch module, with the counter compared exactly."""
from __future__ import annotations

import linecache

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dycl_jax
from dycl_jax.rewrite.api import rewrite_function
from differential import assert_same  # pytest puts tests/ on sys.path


class _Base(nn.Module):
    def __init__(self, n: int = 4):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList([nn.Linear(6, 6) for _ in range(n)])
        self.heads = nn.ModuleList([nn.Linear(6, 3) for _ in range(n)])


class LenBound(_Base):
    """The published early-exit shape: counter from 0, `len(ModuleList)` bound, break on confidence."""

    def forward(self, x):
        i = 0
        while i < len(self.layers):
            x = self.layers[i](x)
            out = self.heads[i](x)
            if F.softmax(out, -1)[0, 0] > F.softmax(out, -1)[0, 1]:
                break
            i += 1
        return out, i


class InclusiveLiteral(_Base):
    """`<=` against a literal, mirrored test, the counter read after the loop."""

    def forward(self, x):
        k = 1
        total = torch.zeros(1)
        while 3 >= k:
            x = self.layers[k](x)
            total = total + x.sum()
            if x.sum() > 0.5:
                break
            k += 1
        return total, k * 10


class NeverRuns(_Base):
    """The counter starts at the bound: the body never runs, the counter is unchanged."""

    def forward(self, x):
        j = 4
        while j < len(self.layers):
            x = self.layers[j](x)
            j += 1
        return x, j


class WithContinue(_Base):
    """A `continue` skips the increment in the original: not a counted loop, left alone."""

    def forward(self, x):
        i = 0
        while i < 4:
            i += 1
            if x.sum() > 0:
                x = x * 0.5
                continue
            x = x + 1
        return x, i


class GrowingBound(_Base):
    """The bound is `len` of a list the body appends to: left alone."""

    def forward(self, x):
        outs = [x]
        i = 0
        while i < len(outs):
            y = self.layers[0](outs[-1])
            if y.sum() > 0:
                outs.append(y)
            if len(outs) > 3:
                break
            i += 1
        return torch.stack(outs).sum(0), len(outs)


STAGED = {"len": LenBound, "inclusive": InclusiveLiteral, "never": NeverRuns}
LEFT_ALONE = {"continue": WithContinue, "growing": GrowingBound}


def _inputs():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(1, 6, generator=g) * s,) for s in (0.1, 0.5, 1.0, 2.0, 4.0, 8.0, -3.0, 0.02) * 4]


def _generated(cls) -> str:
    return "".join(linecache.getlines(rewrite_function(cls.forward).__code__.co_filename))


@pytest.mark.parametrize("name", sorted(STAGED))
def test_counted_loops_stage_as_one_program_and_match_torch(name):
    model = STAGED[name]().eval()
    source = _generated(STAGED[name])
    assert "while_loop" not in source and " in range(" in source
    inputs = _inputs()
    jm = dycl_jax.to_jax(model, inputs[0], host="staged")
    counters = set()
    for k, args in enumerate(inputs):
        with torch.no_grad():
            want = model(*args)
        got = jm(*args)
        assert_same(want, got, f"{name} input {k}")
        counters.add(int(want[1]))
    if name != "never":  # every exit and the normal end are taken
        assert len(counters) >= 4, counters


@pytest.mark.parametrize("name", sorted(LEFT_ALONE))
def test_loops_that_are_not_counted_are_left_alone_and_still_match(name):
    cls = LEFT_ALONE[name]
    assert "in range(i, " not in _generated(cls)
    model = cls().eval()
    inputs = _inputs()
    jm = dycl_jax.to_jax(model, inputs[0])
    for k, args in enumerate(inputs):
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*args), f"{name} input {k}")
