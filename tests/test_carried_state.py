"""Module attributes that carry state from one call to the next: torch's second call sees what the
first left on `self`, a converted model starts every call from the attributes at conversion. A
method whose results see such state is refused with the attribute's file:line under every host
(never a wrong answer from the second call on); state that settles after one call (a cache), or
that no result reads (a counter for logs), or that each call writes before reading converts and
matches torch call after call."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import dycl_jax
from dycl_jax.errors import DyclError
from differential import assert_same


class ReadBackCounter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.calls = 0

    def forward(self, x):
        self.calls = self.calls + 1
        y = self.fc(x) * self.calls
        if y.sum() > 0:
            return y
        return -y


class StreamingState(nn.Module):
    """A recurrent cell whose hidden state stays on `self` for the next chunk."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.GRUCell(6, 6)
        self.h = torch.zeros(1, 6)

    def forward(self, x):
        h = self.cell(x, self.h)
        if h.norm() > 1.0:
            h = h / h.norm()
        self.h = h
        return h


class FilledOnce(nn.Module):
    """A mask cached on the first call: later calls read the same values."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.mask = None

    def forward(self, x):
        if self.mask is None:
            self.mask = torch.tril(torch.ones(6, 6))
        y = self.fc(x) @ self.mask
        if y.mean() > 0:
            return y * 2
        return y


class UnreadCounter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.calls = 0
        self.seen = []

    def forward(self, x):
        self.calls += 1
        y = self.fc(x)
        self.seen.append(y.shape[0])
        if y.sum() > 0:
            return y
        return y - 1


class WrittenFirst(nn.Module):
    """`self.last` changes on every call, but each call writes it before reading it. (Under
    torch.export, which puts module attributes back as they were when it returns, the dispatch
    host once missed this write where the attribute starts as None: a later region read None.)"""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.last = None

    def forward(self, x):
        self.last = torch.relu(self.fc(x))
        if self.last.sum() > 1.0:
            return self.last * 2
        return self.last - 1.0


class WrittenFirstOverATensor(WrittenFirst):
    def __init__(self) -> None:
        super().__init__()
        self.last = torch.zeros(1, 6)


def _inputs(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(1, 6, generator=g) * (0.2 + k % 4) for k in range(n)]


@pytest.mark.parametrize("host", ["auto", "staged", "dispatch"])
@pytest.mark.parametrize("cls, attr, code", [(ReadBackCounter, "calls", "self.calls = self.calls + 1"),
                                             (StreamingState, "h", "self.h = h")])
def test_state_the_results_read_is_refused_at_its_line(cls, attr, code, host):
    torch.manual_seed(0)
    model = cls().eval()
    before = getattr(model, attr)
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(model, (_inputs(1)[0],), host=host)
    err = info.value
    assert f"`self.{attr}`" in str(err) and "carries state from one call to the next" in str(err), str(err)
    assert err.location is not None and err.location.file == __file__ and err.location.code == code, err.location
    assert getattr(model, attr) is before  # the check's calls left the model as it was


@pytest.mark.parametrize("host", ["auto", "dispatch"])
@pytest.mark.parametrize("cls", [FilledOnce, UnreadCounter, WrittenFirst, WrittenFirstOverATensor])
def test_state_that_settles_or_is_not_read_converts_and_matches_call_after_call(cls, host):
    torch.manual_seed(0)
    model, twin = cls().eval(), cls().eval()
    twin.load_state_dict(model.state_dict())
    xs = _inputs(12)
    jm = dycl_jax.to_jax(twin, (xs[0],), host=host)
    signs = set()
    with torch.no_grad():
        for k, x in enumerate(xs):
            want = model(x)
            signs.add(bool(want.sum() > 0))
            assert_same(want, jm(x), f"call {k}")
    assert len(signs) == 2, signs  # both paths, on calls after the first


_TOTAL = [0.0]
_MEMO: dict = {}


class GlobalRunningTotal(nn.Module):
    """A module-level running total read back: every call changes it (it was answered with the
    total at conversion, call after call, under every host)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        _TOTAL[0] += 1.0
        return self.fc(x) * _TOTAL[0]


class GlobalMemo(nn.Module):
    """A module-level cache filled on the first call: it settles, so it converts."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        if "scale" not in _MEMO:
            _MEMO["scale"] = 2.0
        h = self.fc(x)
        if h.sum() > 0:
            return h * _MEMO["scale"]
        return h


@pytest.mark.parametrize("host", ["auto", "staged", "dispatch"])
def test_a_global_the_results_read_is_refused_at_its_line_and_put_back(host):
    torch.manual_seed(0)
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(GlobalRunningTotal().eval(), (_inputs(1)[0],), host=host)
    err = info.value
    assert "`_TOTAL` (a global of test_carried_state.py) carries state" in str(err), str(err)
    assert err.location is not None and err.location.file == __file__ and err.location.code == "_TOTAL[0] += 1.0"
    assert _TOTAL == [0.0]  # the check's calls left the global as it was


def test_a_global_cache_filled_once_converts_and_matches_call_after_call():
    _MEMO.clear()
    test_state_that_settles_or_is_not_read_converts_and_matches_call_after_call(GlobalMemo, "auto")
    # (the dispatch rewrite refuses any change of a global, at its line: converters/attribute_stores.py)
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(GlobalMemo().eval(), (_inputs(1)[0],), host="dispatch")
    assert info.value.location is not None and info.value.location.code.strip() == '_MEMO["scale"] = 2.0'
