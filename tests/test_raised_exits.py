"""Exceptions raised under a tensor condition: `raise Exit(h)` from a block, caught in the forward
as an early exit (by its own class or by `except Exception`), and a `raise ValueError` input check.
A staged construct traces every path, so the raise ran while tracing: the forward's `except`
caught it and went on with the traced path's tensors, and torch.export failed with its own
internal text (`AssertionError: Unexpected key ...`), unlocated. Now staged refuses at the
user's `raise` line; auto and dispatch run the construct in Python and match torch on every exit."""
from __future__ import annotations

import copy
import inspect

import numpy as np
import pytest
import torch
from torch import nn

import dycl_jax
from differential import assert_same
from dycl_jax.errors import DyclError


class Exit(Exception):
    def __init__(self, h: torch.Tensor, depth: int):
        super().__init__(f"exit at {depth}")
        self.h, self.depth = h, depth


class Block(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.depth = depth

    def forward(self, h):
        h = torch.relu(self.fc(h)) + h
        if h.max() > 1.6:
            raise Exit(h, self.depth)
        return h


class CaughtExit(nn.Module):
    """The exit's own class caught around the loop over blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(i) for i in range(3)])

    def forward(self, x):
        try:
            for block in self.blocks:
                x = block(x)
        except Exit as e:
            return e.h, e.depth
        return x, -1


class CaughtAsException(nn.Module):
    """`except Exception as e` around each block, the exit read from the exception's args."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(i) for i in range(3)])
        self.head = nn.Linear(6, 2)

    def forward(self, x):
        exited = -1
        for block in self.blocks:
            try:
                x = block(x)
            except Exception as e:
                x, exited = e.h, e.depth
                break
        return self.head(x), exited


class NanCheck(nn.Module):
    """An input check that raises (never caught)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        h = self.fc(x)
        if h.isnan().any():
            raise ValueError("nan in the hidden state")
        return torch.tanh(h)


RAISE_LINES = {CaughtExit: (Block, "raise Exit(h, self.depth)"), CaughtAsException: (Block, "raise Exit(h, self.depth)"),
               NanCheck: (NanCheck, 'raise ValueError("nan in the hidden state")')}


def _line(obj, code: str) -> int:
    lines, start = inspect.getsourcelines(obj)
    return start + next(i for i, text in enumerate(lines) if text.strip() == code)


def _x(k: int) -> torch.Tensor:
    return torch.randn(1, 6, generator=torch.Generator().manual_seed(k)) * 0.8


@pytest.mark.parametrize("cls", list(RAISE_LINES))
def test_the_staged_host_refuses_at_the_raise(cls):
    torch.manual_seed(0)
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(cls().eval(), (_x(0),), host="staged")
    err = info.value
    assert "raises" in str(err) and "Unexpected key" not in str(err), str(err)
    assert 'host="dispatch"' in (err.fix or ""), str(err)
    owner, code = RAISE_LINES[cls]
    assert err.location is not None and err.location.file == __file__, str(err)
    assert err.location.line == _line(owner, code), str(err)


@pytest.mark.parametrize("host", ["auto", "dispatch"])
@pytest.mark.parametrize("cls", [CaughtExit, CaughtAsException])
def test_a_caught_exit_matches_torch_on_every_exit(cls, host):
    torch.manual_seed(0)
    model = cls().eval()
    jm = dycl_jax.to_jax(copy.deepcopy(model), (_x(0),), host=host)
    assert jm.host == "dispatch"
    exits = set()
    with torch.no_grad():
        for k in range(50):
            want = model(_x(k))
            assert_same(want, jm(_x(k)), f"{cls.__name__} input {k}")
            exits.add(want[1])
    assert exits == {-1, 0, 1, 2}, exits


@pytest.mark.parametrize("host", ["auto", "dispatch"])
def test_an_input_check_raises_as_torch_does(host):
    torch.manual_seed(0)
    model = NanCheck().eval()
    jm = dycl_jax.to_jax(copy.deepcopy(model), (_x(0),), host=host)
    with torch.no_grad():
        for k in range(5):
            assert_same(model(_x(k)), jm(_x(k)), f"input {k}")
    bad = torch.full((1, 6), float("nan"))
    with pytest.raises(ValueError, match="nan in the hidden state"):
        model(bad)
    with pytest.raises(ValueError, match="nan in the hidden state"):
        jm(bad)
    assert np.isfinite(np.asarray(jm(_x(9)))).all()  # (and the host goes on after a raise)
