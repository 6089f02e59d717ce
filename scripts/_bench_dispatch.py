"""Helpers for scripts/bench.py --dynn: what the dispatch host does per forward, and its unit costs.

Everything here observes a converted model from outside: region (and staged-island) calls are
counted by wrapping the host's `run_region` (`run_island`) on the instance, host decisions with
their reads (`DispatchHost.truth`). Import after bench.py has set the
XLA/JAX options.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import torch
from torch import nn

from dycl_jax import JaxModel, to_jax
from dycl_jax.host.dispatch import Compiled


@dataclass
class HostWork:
    """What a dispatch model's host did per forward, averaged over the bench inputs."""

    region_calls: float  # region entries per forward (each runs its parts: compiled, python or torch)
    island_calls: float  # staged-island entries per forward (a construct staged whole inside the host, a loop chunk)
    decisions: float  # host reads of a data-dependent predicate per forward
    regions: int  # distinct regions met so far
    islands: int  # distinct staged islands met so far
    parts: int  # their parts after splitting where torch.export refused
    host_statements: int  # statements that run in torch on the host
    captures: int  # torch.export captures so far
    compilations: int  # XLA executables built so far
    # ms per forward of the compiled programs a forward ran, called back to back with the same
    # arguments and waited for once: what any host running this split pays, with no Python between
    programs_ms: float = float("nan")


def host_work(jm: JaxModel, jax_cases: Sequence[tuple]) -> HostWork | None:
    """Count region calls and host decisions over one call per input (None unless jm is dispatch)."""
    if jm.host != "dispatch":
        return None
    host = jm._fn
    # (host decisions counted as the host reads them: recording them would make every call a
    # traced one, which runs a chunked loop as a host loop, host/chunks.py)
    calls = {name: 0 for name in ("run_region", "run_island", "truth") if hasattr(host, name)}
    for name in calls:  # an instance attribute shadows the method for this pass only
        setattr(host, name, _counting(getattr(host, name), calls, name))
    try:
        for case in jax_cases:
            jax.block_until_ready(jm(*case))
    finally:
        for name in calls:
            delattr(host, name)
    report = jm.report()
    n = len(jax_cases)
    kinds = [getattr(st.spec, "kind", "region") for st in host.regions.values()]
    return HostWork(
        calls["run_region"] / n, calls.get("run_island", 0) / n, calls.get("truth", 0) / n,
        kinds.count("region"), kinds.count("island"), sum(len(st.parts) for st in host.regions.values()),
        len(report.host_statements), report.captures, report.compilations,
        _programs_ms(jm, jax_cases),
    )


def _programs_ms(jm: JaxModel, jax_cases: Sequence[tuple], rounds: int = 30) -> float:
    """Median ms per forward of replaying the compiled programs the inputs ran, in call order
    with their recorded arguments (host reads, numpy work and Python between them left out)."""
    host = jm._fn
    programs = [e for st in host.regions.values() for p in st.parts for e in p.cache.values()
                if isinstance(e, Compiled)]
    calls: list[tuple[Callable, tuple]] = []
    originals = [e.fn for e in programs]
    for e in programs:  # an instance attribute per program: programs share one jitted fn
        def recorded(*args: Any, _fn: Callable = e.fn) -> Any:
            calls.append((_fn, args))
            return _fn(*args)
        e.fn = recorded
    try:
        for case in jax_cases:
            jax.block_until_ready(jm(*case))
    finally:
        for e, fn in zip(programs, originals):
            e.fn = fn
    if not calls:
        return 0.0

    def replay() -> None:
        jax.block_until_ready([fn(*args) for fn, args in calls])
    replay()
    return _median_us(replay, rounds) / 1e3 / len(jax_cases)


def _counting(method: Callable, calls: dict[str, int], name: str) -> Callable:
    """`method`, adding one to calls[name] per call."""
    def counted(*args: Any) -> Any:
        calls[name] += 1
        return method(*args)
    return counted


# ---------------------------------------------------------------- unit costs


class _OneRegion(nn.Module):
    """One region, no decision: the whole forward is one trivial jitted program."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


@dataclass
class UnitCosts:
    """Microseconds (medians) of the dispatch host's building blocks on a 1-element float32."""

    predicate_read_us: float  # bool(y) of a fresh, ready output of a jitted predicate: one host decision
    jit_call_us: float  # a trivial jitted program (x + 1) called and waited for
    region_call_us: float  # the host's run_region on a trivial compiled region (x + 1), waited for
    one_region_model_us: float  # jm(x) for a dispatch model whose forward is that one region


def _median_us(fn: Callable[[], Any], reps: int) -> float:
    """Median microseconds of `fn()` over `reps` calls."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _read_us(reps: int) -> float:
    """Median microseconds of bool(y) on fresh outputs of a tiny jitted predicate (all ready first)."""
    pred = jax.jit(lambda v: v > 0)
    x = jnp.ones((), jnp.float32)
    outs = [pred(x) for _ in range(reps)]  # a fresh array per read: an array caches its host copy
    jax.block_until_ready(outs)
    it = iter(outs)
    return _median_us(lambda: bool(next(it)), reps)


def _region_call_us(jm: JaxModel, x: jax.Array, reps: int) -> float:
    """Median microseconds of the host running jm's region directly, with the arguments one call gave it."""
    host = jm._fn
    recorded: list[tuple] = []
    run_region = host.run_region

    def record(*args: Any) -> tuple:
        recorded.append(args)
        return run_region(*args)

    host.run_region = record
    try:
        jax.block_until_ready(jm(x))
    finally:
        del host.run_region
    (args,) = recorded  # the model is one region
    return _median_us(lambda: jax.block_until_ready(host.run_region(*args)), reps)


def unit_costs(reps: int = 2000) -> UnitCosts:
    """The dispatch host's unit costs, measured on tiny programs."""
    inc = jax.jit(lambda v: v + 1)
    x = jnp.zeros(1, jnp.float32)
    jax.block_until_ready(inc(x))
    jm = to_jax(_OneRegion().eval(), (torch.zeros(1),), host="dispatch")
    return UnitCosts(
        _read_us(reps),
        _median_us(lambda: jax.block_until_ready(inc(x)), reps),
        _region_call_us(jm, x, reps),
        _median_us(lambda: jax.block_until_ready(jm(x)), reps),
    )
