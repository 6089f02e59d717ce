"""Draws from Python's or numpy's global generator in a forward (`random.random() < p`,
`np.random.randint(3)` as a depth, a helper that flips a coin). Traced once, a program would hold
the one number drawn at conversion and take the same path on every call: before, every host did
that (one outcome over 40 calls where torch gives two or three). Now the staged host refuses at
the line that draws, and the dispatch host (and auto, which moves there) runs the drawing
statement in Python on every call: with the generators seeded alike, its outputs are torch's
exactly, and the conversion leaves the generators as it found them."""
from __future__ import annotations

import copy
import random
from random import random as uniform

import numpy as np
import pytest
import torch
from torch import nn

import dycl_jax
import dycl_jax.convert  # noqa: F401  (imported now: importing its libraries draws from `random`)
from differential import assert_same
from dycl_jax.errors import DyclError


def coin() -> bool:
    return random.random() < 0.3


class RandomBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        if random.random() < 0.5:
            h = h * 2
        return h


class NumpyDepth(nn.Module):
    """A random number of extra layers (stochastic depth at inference, numpy style)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.extra = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        depth = np.random.randint(0, 3)
        for _ in range(depth):
            h = torch.relu(self.extra(h))
        return h, depth


class HelperCoin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        explore = coin()
        if explore:
            h = -h
        return h, int(explore)


class AliasedUniformInDataBranch(nn.Module):
    """A draw under a tensor-decided branch, through a name imported from `random`."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:
            h = h * uniform()
        return h


DRAW_LINES = {RandomBranch: "if random.random() < 0.5:", NumpyDepth: "depth = np.random.randint(0, 3)",
              HelperCoin: "return random.random() < 0.3", AliasedUniformInDataBranch: "h = h * uniform()"}


def _line(obj, code: str) -> int:
    import inspect
    lines, start = inspect.getsourcelines(obj)
    return start + next(i for i, text in enumerate(lines) if text.strip() == code)


def _seed(k: int) -> None:
    random.seed(k)
    np.random.seed(k)


def _x(k: int) -> torch.Tensor:
    return torch.randn(1, 4, generator=torch.Generator().manual_seed(k)) * 2


@pytest.mark.parametrize("cls", list(DRAW_LINES))
def test_the_staged_host_refuses_at_the_line_that_draws(cls):
    torch.manual_seed(0)
    _seed(1)
    before = random.getstate(), np.random.get_state()[1].copy()
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(cls().eval(), (_x(0),), host="staged")
    err = info.value
    assert "global generator" in str(err) and 'host="dispatch"' in (err.fix or ""), str(err)
    owner = coin if cls is HelperCoin else cls
    assert err.location is not None and err.location.file == __file__, str(err)
    assert err.location.line == _line(owner, DRAW_LINES[cls]), str(err)
    # the conversion's own runs of the model put the generators back
    assert random.getstate() == before[0] and np.array_equal(np.random.get_state()[1], before[1])


@pytest.mark.parametrize("host", ["auto", "dispatch"])
@pytest.mark.parametrize("cls", list(DRAW_LINES))
def test_the_dispatch_host_draws_on_every_call_as_torch_does(cls, host):
    torch.manual_seed(0)
    model = cls().eval()
    jm = dycl_jax.to_jax(copy.deepcopy(model), (_x(0),), host=host)
    assert jm.host == "dispatch"
    outcomes = set()
    with torch.no_grad():
        for k in range(30):
            x = _x(k)
            _seed(k)
            want = model(x)
            _seed(k)
            got = jm(x)
            assert_same(want, got, f"{cls.__name__} seed {k}")
            first = want[0] if isinstance(want, tuple) else want
            outcomes.add(round(float(first.sum()), 4) if cls is not NumpyDepth else want[1])
            # and the converted call drew as many numbers as torch's
            assert random.random() == (_seed(k), model(x), random.random())[2], f"seed {k}"
    assert len(outcomes) >= 2, outcomes


class DrawPlusBatch(nn.Module):
    """A Python statement drawing beside the batch size: a new batch size is a new signature
    of that statement, which the host first runs as a probe (does it stay Python?)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        n = x.shape[0]
        k = random.randint(0, 2) + n
        h = self.fc(x)
        for _ in range(k):
            h = h + 1
        return h, k


def test_draws_stay_torchs_at_signatures_first_seen_after_conversion():
    """The first-call probes run inside the user's call at a new signature: they put the
    generators back, so the call still draws what torch's would."""
    torch.manual_seed(0)
    model = DrawPlusBatch().eval()
    jm = dycl_jax.to_jax(copy.deepcopy(model), (_x(0),), host="dispatch")
    with torch.no_grad():
        for k in range(12):
            x = torch.randn(1 + k % 4, 4, generator=torch.Generator().manual_seed(k))
            _seed(k)
            want = model(x)
            _seed(k)
            assert_same(want, jm(x), f"seed {k} batch {x.shape[0]}")
            assert random.random() == (_seed(k), model(x), random.random())[2], f"seed {k}"
