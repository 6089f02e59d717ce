"""Clock reads in a forward (anytime inference under a time budget: `start = time.perf_counter()`,
`if time.perf_counter() - start > budget: break`). Traced once, a program would hold the one
reading taken at conversion and stop at the same block on every call: before, every host did
that. Now the staged host refuses at the first line that reads the clock, and the dispatch host
(and auto, which moves there) runs the reading statements in Python on every call. The tests
drive the models with a deterministic fake clock installed where the model reads it (the `time`
module's function, or a name imported from it), so torch and the converted model see the same
readings and must stop at the same block."""
from __future__ import annotations

import copy
import datetime
import inspect
import sys
import time
from time import perf_counter as now

import numpy as np
import pytest
import torch
from torch import nn

import dycl_jax
from differential import assert_same
from dycl_jax.capture import host_clock
from dycl_jax.host import dispatch
from dycl_jax.errors import DyclError

EMITTED = "clock_emitted"  # the module name the emitted source is loaded under
BUDGET = 1.0
TICKS = [0.1, 0.3, 0.45, 0.6, 2.0]  # per reading: the loop below stops after 6, 4, 3, 2 and 1 blocks


class FakeClock:
    """A clock that advances by `tick` at every reading by this file's code (the models, run by
    torch or by the converted host); torch's own timers, which read the same function while it
    traces, get the time the clock holds without moving it."""

    def __init__(self) -> None:
        self.t, self.tick, self.reads = 0.0, 0.0, 0

    def reset(self, tick: float) -> None:
        self.t, self.tick, self.reads = 100.0, tick, 0

    def read(self, caller: dict) -> float:
        if caller.get("__name__") in (__name__, EMITTED):
            self.t += self.tick
            self.reads += 1
        return self.t

    def function(self):
        """The clock as a plain function, as `time.perf_counter` is (an object of this file's
        class with fields that change at every call would be state kept across calls, refused)."""
        def perf_counter() -> float:
            return self.read(sys._getframe(1).f_globals)
        return perf_counter


def fake_datetime(clock: FakeClock) -> type:
    """`datetime.datetime` whose `now()` is the fake clock's reading in seconds after a fixed day."""
    class FakeDatetime(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2026, 1, 1) + datetime.timedelta(seconds=clock.read(sys._getframe(1).f_globals))
    return FakeDatetime


WALL = datetime.datetime  # the fixture puts the fake datetime here (`from datetime import datetime as WALL`)


def _blocks() -> nn.ModuleList:
    return nn.ModuleList([nn.Linear(6, 6) for _ in range(6)])


class BudgetLoop(nn.Module):
    """Anytime inference: as many blocks as the budget allows."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = _blocks()
        self.budget = BUDGET

    def forward(self, x):
        start = time.perf_counter()
        depth = 0
        for block in self.blocks:
            x = torch.relu(block(x))
            depth += 1
            if time.perf_counter() - start > self.budget:
                break
        return x, depth


class DeadlineWhile(nn.Module):
    """A deadline from `time.time()` and a `while` over the blocks by index."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = _blocks()

    def forward(self, x):
        deadline = time.time() + BUDGET
        i = 0
        while i < len(self.blocks):
            x = torch.tanh(self.blocks[i](x))
            i += 1
            if time.time() >= deadline:
                break
        return x, i


def elapsed_since(start: float) -> float:
    return time.perf_counter() - start


class HelperElapsed(nn.Module):
    """The clock read in a helper function the converter does not rewrite."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = _blocks()

    def forward(self, x):
        start = time.perf_counter()
        for block in self.blocks:
            x = block(x).sigmoid()
            if elapsed_since(start) > BUDGET:
                break
        return x


class ImportedNameWithConfidence(nn.Module):
    """`from time import perf_counter as now`, and the budget beside a confidence exit."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = _blocks()
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        start = now()
        for block in self.blocks:
            x = torch.relu(block(x))
            conf = torch.softmax(self.head(x), -1).max()
            if conf > 0.9 or now() - start > BUDGET:
                break
        return self.head(x)


class LatencyOutput(nn.Module):
    """The clock read only for a latency the forward returns beside its output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        t0 = time.perf_counter()
        y = self.fc(x)
        if y.sum() > 0:
            y = y * 2
        return y, time.perf_counter() - t0


class WallClockBudget(nn.Module):
    """The budget read with `datetime.now()` (a C type's method, which cannot be wrapped in place)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = _blocks()

    def forward(self, x):
        start = WALL.now()
        depth = 0
        for block in self.blocks:
            x = torch.relu(block(x))
            depth += 1
            if (WALL.now() - start).total_seconds() > BUDGET:
                break
        return x, depth


FIRST_READ = {BudgetLoop: "start = time.perf_counter()", WallClockBudget: "start = WALL.now()", DeadlineWhile: "deadline = time.time() + BUDGET",
              HelperElapsed: "start = time.perf_counter()", ImportedNameWithConfidence: "start = now()",
              LatencyOutput: "t0 = time.perf_counter()"}


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    read = fake.function()
    for name in ("perf_counter", "time"):
        monkeypatch.setattr(time, name, read)
    monkeypatch.setitem(globals(), "now", read)
    monkeypatch.setitem(globals(), "WALL", fake_datetime(fake))
    return fake


def _line(obj, code: str) -> int:
    lines, start = inspect.getsourcelines(obj)
    return start + next(i for i, text in enumerate(lines) if text.strip() == code)


def _x(k: int) -> torch.Tensor:
    return torch.randn(1, 6, generator=torch.Generator().manual_seed(k))


@pytest.mark.parametrize("cls", list(FIRST_READ))
def test_the_staged_host_refuses_at_the_first_clock_read(cls, clock):
    torch.manual_seed(0)
    clock.reset(0.3)
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(cls().eval(), (_x(0),), host="staged")
    err = info.value
    assert "reads the clock" in str(err) and 'host="dispatch"' in (err.fix or ""), str(err)
    assert err.location is not None and err.location.file == __file__, str(err)
    assert err.location.line == _line(cls, FIRST_READ[cls]), str(err)


@pytest.mark.parametrize("host", ["auto", "dispatch"])
@pytest.mark.parametrize("cls", list(FIRST_READ))
def test_the_dispatch_host_reads_the_clock_on_every_call(cls, host, clock):
    torch.manual_seed(0)
    model = cls().eval()
    clock.reset(0.3)
    jm = dycl_jax.to_jax(copy.deepcopy(model), (_x(0),), host=host)
    assert jm.host == "dispatch"
    outcomes = set()
    with torch.no_grad():
        for k in range(15):
            x, tick = _x(k), TICKS[k % len(TICKS)]
            clock.reset(tick)
            want = model(x)
            torch_reads = clock.reads
            clock.reset(tick)
            got = jm(x)
            assert_same(want, got, f"{cls.__name__} call {k} tick {tick}")
            assert clock.reads == torch_reads, f"call {k}: {clock.reads} readings, torch took {torch_reads}"
            if isinstance(want, tuple):
                outcomes.add(want[1])
    if cls in (BudgetLoop, DeadlineWhile, WallClockBudget):
        assert outcomes == {1, 2, 3, 4, 6}, outcomes  # every depth the ticks give was taken (and matched)


def test_clock_functions_are_put_back_after_a_capture(clock):
    """The watch wraps what the names hold (here the fake) only while a program is captured."""
    before = time.perf_counter, time.time, time.monotonic, now
    dycl_jax.to_jax(BudgetLoop().eval(), (_x(0),), host="dispatch")
    assert (time.perf_counter, time.time, time.monotonic, now) == before
    with host_clock.watched():
        assert time.perf_counter is not before[0] and now is not before[3]
        start = host_clock.count()
        time.perf_counter()
        torch.ones(2).sum()  # (library code reading a clock is not counted; this test's own read is)
        assert host_clock.count() == start + 1
    assert time.perf_counter is before[0] and now is before[3]


def test_a_model_reading_no_clock_still_stages():
    """Torch's own timers while it traces are library code: they do not count as a read."""
    model = nn.Sequential(nn.Linear(6, 6), nn.ReLU()).eval()
    jm = dycl_jax.to_jax(model, (_x(0),), host="auto")
    assert jm.host == "staged"
    assert_same(model(_x(1)), jm(_x(1)), "sequential")


def test_an_emitted_dispatch_module_reads_the_clock_on_every_call(clock, tmp_path):
    """The emitted module keeps the reading statements as Python (`time` is no torch), with the
    budget attribute the host code reads written as its value."""
    torch.manual_seed(0)
    model = BudgetLoop().eval()
    clock.reset(0.3)
    jm = dycl_jax.to_jax(copy.deepcopy(model), (_x(0),), host="dispatch")
    for tick in TICKS:
        clock.reset(tick)
        jm(_x(1))
    jm.emit(str(tmp_path / "out"))
    import importlib.util
    spec = importlib.util.spec_from_file_location(EMITTED, tmp_path / "out" / "model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    emitted = mod.load()
    with torch.no_grad():
        for k, tick in enumerate(TICKS):
            x = _x(k)
            clock.reset(tick)
            want = model(x)
            clock.reset(tick)
            got = emitted(x.numpy())
            np.testing.assert_allclose(np.asarray(got[0]), want[0].numpy(), atol=1e-5, rtol=1e-5)
            assert int(got[1]) == want[1], f"tick {tick}"


@pytest.mark.parametrize("cls", [BudgetLoop, LatencyOutput])
def test_a_new_reading_is_no_new_signature(cls, clock, monkeypatch):
    """The statements that take a reading run as Python at a reading (a float) they have not
    seen: no probe or capture per value, and no cache entry once a part holds DIRECT_ENTRIES
    (here none beyond the first), so a long run's host does not grow."""
    monkeypatch.setattr(dispatch, "DIRECT_ENTRIES", 0)
    torch.manual_seed(0)
    clock.reset(0.3)
    jm = dycl_jax.to_jax(cls().eval(), (_x(0),), host="dispatch")
    host = jm._fn

    def size() -> tuple[int, int]:
        return sum(len(p.cache) for st in host.regions.values() for p in st.parts), host.captures

    for k in range(20):  # every path once
        clock.reset(TICKS[k % len(TICKS)])
        jm(_x(k))
    seen = size()
    for k in range(20):
        clock.reset(TICKS[k % len(TICKS)] + 0.001 * (k + 1))  # readings never seen before
        jm(_x(k))
    assert size() == seen, f"(cache entries, captures) grew from {seen} to {size()}"
