"""Branches on tensors built only from Python constants run as Python; data-dependent flags still stage."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
import torch
import torch.nn as nn

import dycl_jax
from dycl_jax.rewrite import operators as ops
from dycl_jax.rewrite.api import run_torch_trace
from dycl_jax.rewrite.sites import Site
from examples.dynn import load
from differential import assert_same  # pytest puts tests/ on sys.path
from gradient_parity import assert_gradients_match, one_per_path

N_INPUTS = 50




@lru_cache(maxsize=None)
def _sdn():
    model, args = load("sdn_published").example()
    return model, dycl_jax.to_jax(model, args, host="staged")


def test_sdn_published_is_one_staged_program():
    _, jm = _sdn()
    assert jm.host == "staged"


def test_sdn_published_matches_torch_on_every_path():
    mod = load("sdn_published")
    model, jm = _sdn()
    paths: set = set()
    exit_types: set = set()
    for k, args in enumerate(mod.inputs(N_INPUTS)):
        with torch.no_grad():
            original = model(*args)
        got, jax_decisions = jm.trace(*args)
        assert_same(original, got, f"input {k} (jax vs original torch)")
        rewritten_out, torch_decisions = run_torch_trace(model, "forward", args)
        assert_same(original, rewritten_out, f"input {k} (rewritten torch vs original)")
        assert jax_decisions == torch_decisions, f"input {k}: decisions differ"
        if k < 3:  # the plain (untraced) program is a separate compilation
            assert_same(original, jm(*args), f"input {k} (untraced call)")
        paths.update(mod.path_of(model, args))
        exit_types.add(type(original[1]))
    assert paths == set(mod.PATHS), f"paths never taken: {set(mod.PATHS) - paths}"
    # `output_id += is_output`: the exit id is an int, a 0-d tensor or np.int64 depending on the path
    assert {int, torch.Tensor, np.int64} <= exit_types, exit_types
    assert_gradients_match(model, jm, one_per_path(mod, model, mod.inputs(N_INPUTS)), "sdn_published")


class _InputFlag(nn.Module):
    """A block flag that looks like sdn's but is computed from the input: a data-dependent test."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        flag = torch.tensor(1) * (h.sum() > 0)
        if flag:
            out = h * 2
        else:
            out = h - 1
        return out, flag


class _BufferFlag(nn.Module):
    """A flag held as a buffer: model state, so it stays a graph value (the user may change it)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("on", torch.tensor(1))

    def forward(self, x):
        h = self.lin(x)
        if self.on * (h.sum() > 0):
            out = h * 2
        else:
            out = h - 1
        return out


@pytest.mark.parametrize("cls", [_InputFlag, _BufferFlag])
def test_flags_from_inputs_or_state_stay_data_dependent(cls):
    torch.manual_seed(0)
    model = cls().eval()
    xs = [torch.randn(1, 4) * s for s in (1.0, -1.0, 3.0, -3.0, 0.5, -0.5)]
    jm = dycl_jax.to_jax(model, (xs[0],), host="staged")
    assert jm.host == "staged"
    taken = set()
    for k, x in enumerate(xs):
        with torch.no_grad():
            original = model(x)
        got, decisions = jm.trace(x)
        assert_same(original, got, f"input {k}")
        sites = [value for site, value in decisions if site.startswith("if@")]
        assert len(sites) == 1, decisions  # the `if` is a cond in the staged program
        taken.add(sites[0])
        _, torch_decisions = run_torch_trace(model, "forward", (x,))
        assert decisions == torch_decisions
    assert taken == {True, False}, "both paths must be exercised"


class _FlagInBranch(nn.Module):
    """A constant flag tested inside a data-dependent branch: staged, that branch still decides it
    while tracing (were it a cond, `extra` would be a tensor on one path and None on the other)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        use_extra = torch.tensor(1)
        if h.sum() > 0:
            extra = self.lin(h) if use_extra else None
            out = h * 2 if extra is None else h + extra
        else:
            out = h - 1
        return out, use_extra


def test_constant_flag_inside_a_data_dependent_branch():
    torch.manual_seed(0)
    model = _FlagInBranch().eval()
    xs = [torch.randn(1, 4) * s for s in (1.0, -1.0, 3.0, -3.0, 0.5, -0.5)]
    jm = dycl_jax.to_jax(model, (xs[0],), host="staged")
    taken = set()
    for k, x in enumerate(xs):
        with torch.no_grad():
            original = model(x)
        got, decisions = jm.trace(x)
        assert_same(original, got, f"input {k}")
        assert [site for site, _ in decisions] == [decisions[0][0]], decisions  # only `if h.sum() > 0`
        taken.add(decisions[0][1])
        assert decisions == run_torch_trace(model, "forward", (x,))[1]
    assert taken == {True, False}


IF = Site("if", "/src/model.py", 12, "if c:", ("a", "b"), ("true branch", "false branch"), ((13, 14), (None, 16)))


def test_tracing_decides_constants_like_staging_and_records_the_rest():
    """The eager mirror (run_torch_trace) follows the fake tensor mode's rules for constants."""
    t = lambda a, b: (a + 1, b)  # noqa: E731
    f = lambda a, b: (a - 1, b)  # noqa: E731
    x = torch.ones(3)  # an input: made outside the traced program
    with ops.tracing() as decisions:
        flag = torch.tensor(1)
        assert ops.cond(flag, t, f, (1, 2), IF) == (2, 2)  # Python: no record, ints stay ints
        assert ops.cond(flag * 2 - 2, t, f, (1, 2), IF) == (0, 2)  # ops on constants: constants
        assert ops.and_(torch.tensor(0), lambda: 1 / 0).item() == 0  # Python short-circuit, Python result
        a, _ = ops.cond(flag * (x.sum() > 0), t, f, (1, 2), IF)  # depends on the input
        assert isinstance(a, torch.Tensor) and a.item() == 2
        written = torch.tensor(0)
        written.view(1).add_(x.sum() > 0)  # written through a view with an input's value
        a, _ = ops.cond(written, t, f, (1, 2), IF)
        assert a.item() == 2
        b, _ = ops.cond(torch.tensor(1) * torch.rand(()), t, f, (1, 2), IF)  # random: not a constant
    assert decisions == [("if@model.py:12", True)] * 3
