"""State a forward keeps outside modules and objects: a closure's cells (`TICK = make_counter()`
bumping its `nonlocal n`, a closure's dict changed in place) and a global iterator it advances
(`k = next(COUNT)`, a generator). Before, every host held the value of the conversion's calls
and answered differently from torch on every later call, with no error. Now the carried-state
check reads closure cells and iterator positions as it reads module attributes, so the
conversion is refused at the line that changes them; the conversion leaves them as they were;
closures and iterators that keep no state still convert."""
from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

import dycl_jax
from differential import assert_same
from dycl_jax.errors import DyclError


def make_counter(start: float):
    n = start

    def tick():
        nonlocal n
        n += 1.0
        return n
    return tick


def make_meter():
    seen = {"calls": 0}

    def bump(x):
        seen["calls"] += 1
        return x * seen["calls"]
    return bump


def make_scale(factor: float):
    def scale(x):
        return x * factor
    return scale


def halves():
    v = 1.0
    while True:
        yield v
        v /= 2.0


TICK = make_counter(10.0)
METER = make_meter()
SCALE = make_scale(3.0)
COUNT = itertools.count(5)
HALVES = halves()
REPEAT = itertools.repeat(2.0)


class GlobalTick(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        stamp = TICK()
        return self.fc(x) * stamp


class HeldTick(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.tick = make_counter(0.0)

    def forward(self, x):
        return self.fc(x) * self.tick()


class Metered(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return METER(self.fc(x))


class Counted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        k = next(COUNT)
        return self.fc(x) * k


class Halved(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc(x)
        if h.mean() > 0:  # a data-dependent branch as well: the rewritten forward reads the generator too
            h = h * 2.0
        return h * next(HALVES)


class Stateless(nn.Module):
    """A closure reading a constant and an iterator that stays where it is: no state kept."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = SCALE(self.fc(x))
        if h.sum() > 0:
            h = h + next(REPEAT)
        return h


def _x(seed: int) -> torch.Tensor:
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("host", ["staged", "dispatch", "auto"])
@pytest.mark.parametrize("model_cls, name, line", [
    (GlobalTick, "`n` (kept by the closure `TICK`", "n += 1.0"),
    (HeldTick, "`n` (kept by the closure `self.tick`", "n += 1.0"),
    (Metered, "`seen` (kept by the closure `METER`", 'seen["calls"] += 1'),
    (Counted, "`COUNT`", "k = next(COUNT)"),
])
def test_state_kept_by_a_closure_or_an_iterator_is_refused(host, model_cls, name, line):
    torch.manual_seed(0)
    model = model_cls().eval()
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(model, (_x(0),), host=host)
    err = info.value
    assert "carries state" in str(err) and name in str(err), str(err)
    assert err.location is not None and err.location.code == line, str(err)


def test_a_generator_the_forward_advances_is_refused():
    torch.manual_seed(0)
    with pytest.raises(DyclError, match="`HALVES`.*carries state"):
        dycl_jax.to_jax(Halved().eval(), (_x(0),), host="auto")


def test_the_refused_conversion_leaves_cells_and_iterators_where_they_were():
    for cls in (GlobalTick, HeldTick, Metered, Counted):
        model = cls().eval()
        before = (TICK.__closure__[0].cell_contents, METER.__closure__[0].cell_contents["calls"],
                  getattr(model, "tick", None) and model.tick.__closure__[0].cell_contents)
        with pytest.raises(DyclError):
            dycl_jax.to_jax(model, (_x(0),), host="auto")
        after = (TICK.__closure__[0].cell_contents, METER.__closure__[0].cell_contents["calls"],
                 getattr(model, "tick", None) and model.tick.__closure__[0].cell_contents)
        assert after == before
    assert next(COUNT) == 5  # (an iterator advanced by the check's calls is put back as a copy)


@pytest.mark.parametrize("host", ["staged", "dispatch", "auto"])
def test_closures_and_iterators_that_keep_no_state_still_convert(host):
    torch.manual_seed(0)
    model = Stateless().eval()
    jm = dycl_jax.to_jax(model, (_x(0),), host=host)
    with torch.no_grad():
        for seed in range(6):
            assert_same(model(_x(seed)), jm(_x(seed)), f"input {seed}")
