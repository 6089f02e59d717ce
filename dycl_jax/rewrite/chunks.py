"""A host loop run a few iterations per program: the staged form of a `while` loop unrolled
`steps` times, returning the loop's values after each iteration and whether the loop stops there.

The dispatch host runs a loop whose values change shape from one iteration to the next (a decode
loop growing its sequence: no staged `while_loop` holds it) as Python, one program and one host
read per iteration. A chunk computes `steps` iterations in one program instead, speculatively:
iteration j+1 is computed whether or not the test after iteration j stops the loop, and the host
keeps the values after the first iteration whose test says stop (host/chunks.py). Running an
iteration the loop would not have run changes nothing the host keeps: a staged body has no effect
outside its values (captures refuse attribute writes, draws and clock reads), and XLA raises no
error on the values it computes (an index out of range is clamped), so the values kept are those
of the iterations torch runs.

The chunk is the loop's staged island (converters/dispatch_split.py, `chunks`) traced with a
recorder set: its `while_loop` (operators.py) unrolls instead of staging, and the island's own
result is not used. An `if c: break` of the body is an exit as the loop's test is (`guard_branch`):
the iterations go on along the branch that does not break, so Python values stay Python. Where
the loop stops on every input within `reach` iterations (a Python bound), the chunk runs to there.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from dycl_jax.errors import CaptureError, Location
from dycl_jax.rewrite import attribute_watch, chunk_hazards as hazards, lifting
from dycl_jax.rewrite.constants import static
from dycl_jax.rewrite.sites import Site


@dataclass
class Recorder:
    """What the chunked loop's `while_loop` saw: its carried names, where it may stop, its values
    after the chunk's last iteration."""

    file: str
    line: int  # the user's `while` (a loop nested in its body is staged as usual)
    steps: int
    # iterations traced to look for a stop on every input (a Python bound, `step >= max_len`):
    # one found within them ends the chunk there; none found, the chunk keeps `steps`
    reach: int = 0
    names: tuple[str, ...] = ()
    # per possible stop, in order: (iterations done, the stop test (a 0-d bool tensor, or True
    # where it stops on every input), which break guard of the iteration (-1: the loop's test),
    # the loop's values there)
    exits: list[tuple[int, Any, int, tuple]] = field(default_factory=list)
    last: tuple = ()  # the values after `steps` iterations: the next chunk starts from them
    env: dict[str, Any] = field(default_factory=dict)  # the island's names as the loop starts
    used: bool = False
    exiting: int | None = None  # the break guard an exit's trace takes (None: the loop goes on)
    guards: list[Any] = field(default_factory=list)  # the stop tests of the iteration's break guards

    @property
    def limit(self) -> int:
        """The iterations traced at most."""
        return max(self.reach, self.steps)


_RECORDER: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("dycl_chunk", default=None)
_ITERATION: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("dycl_chunk_body", default=None)


def pending(site: Site) -> Recorder | None:
    """The recorder waiting for this loop, or None (no chunk traced, or another loop)."""
    rec = _RECORDER.get()
    if rec is None or rec.used or site.line != rec.line or site.file != rec.file:
        return None
    rec.used = True
    return rec


def guard_branch(site: Site, inputs: tuple, stop: Callable[[], torch.Tensor]) -> int | None:
    """The branch a break guard (`Site.exit_branch`: `if c: break`) of the chunked loop's body
    takes while an iteration is traced, or None (any other cond: staged as usual).

    The chunk computes its iterations speculatively: the values that go on to the next
    iteration are those of the path where the loop does not stop here, so the guard takes the
    branch that leaves the break flag unset, and its test (`stop()`) becomes an exit, whose values
    a second trace of the iteration gives by taking the other branch (`unroll`). The flag stays
    a Python bool and the values the guard's branches change stay Python values (a staged cond
    would make the loop's counter a tensor). A guard inside a graph construct of the body (a
    staged cond's branch, an inner loop: `nested`) is that construct's, staged as usual."""
    rec = _ITERATION.get()
    if rec is None or site.exit_branch is None:
        return None
    flag, k = site.exit_branch
    if flag not in rec.names or inputs[site.inputs.index(flag)] is not False:
        return None
    g = len(rec.guards)
    rec.guards.append(stop() if k == 0 else torch.logical_not(stop()))
    return k if rec.exiting == g else 1 - k


@contextlib.contextmanager
def nested() -> Iterator[None]:
    """Inside a graph construct (operators.py): no break guard of a chunk's iteration is taken
    as an exit there (the construct's outputs join its paths)."""
    token = _ITERATION.set(None)
    try:
        yield
    finally:
        _ITERATION.reset(token)


def _iteration(rec: Recorder, body_fn: Callable, carry: tuple, invariants: tuple, exiting: int | None) -> tuple:
    token = _ITERATION.set(rec)
    rec.exiting, rec.guards = exiting, []
    try:
        return tuple(body_fn(*carry, *invariants))
    finally:
        _ITERATION.reset(token)


def _step(rec: Recorder, j: int, test_fn: Callable, body_fn: Callable, carry: tuple, invariants: tuple,
          pred: Callable[[torch.Tensor], torch.Tensor]) -> tuple[bool, tuple]:
    """The test on the values after j iterations (an exit where it may stop) and iteration j+1:
    (whether the loop stops here on every input, the values after iteration j+1)."""
    test = static(test_fn(*carry, *invariants))
    if not isinstance(test, torch.Tensor) and not test:
        rec.exits.append((j, True, -1, carry))
        return True, carry
    if isinstance(test, torch.Tensor):
        rec.exits.append((j, torch.logical_not(pred(test)), -1, carry))
    if j == rec.limit:
        return False, carry
    going = _iteration(rec, body_fn, carry, invariants, None)
    for g, stop in enumerate(list(rec.guards)):  # the values where guard g breaks: the iteration traced again
        rec.exits.append((j + 1, stop, g, _iteration(rec, body_fn, carry, invariants, g)))
    return False, going


def unroll(rec: Recorder, site: Site, test_fn: Callable, body_fn: Callable, carry: tuple, invariants: tuple,
           pred: Callable[[torch.Tensor], torch.Tensor], frame: Any) -> tuple:
    """Trace the chunk's iterations straight into the graph, each test and break guard beside
    them (`rec.steps`, or up to a stop on every input within `rec.reach`); the loop's values as
    they came in (the island's result, which the chunk does not use)."""
    rec.names = site.names
    # the island's names at the loop (statements before it in the island made them): the chunk's
    # outputs and its next chunk's inputs may include some the loop does not carry
    rec.env = dict(frame.f_locals)
    named = {**rec.env, **dict(zip(site.inputs, (*carry, *invariants)))}
    hazards.refuse_shared(site, named)
    versions = hazards.versions(named)
    start = carry
    # a module attribute or global the iterations change would leave the chunk at its value after
    # the last one, not at the stop's: refused as a staged loop body's change is (its host loop runs)
    watch = attribute_watch.snapshot(lifting.roots())
    states: list[tuple] = []
    stopped = False
    for j in range(rec.limit + 1):
        states.append(carry)
        try:
            stopped, carry = _step(rec, j, test_fn, body_fn, carry, invariants, pred)
        except Exception:  # noqa: BLE001  (a look past `steps` that fails: the chunk keeps `steps`)
            if j < rec.steps:
                raise
            break
        if stopped or j == rec.limit:
            break
    if not stopped:  # no stop on every input within `reach`: a chunk of `steps` (the rest is dead code)
        rec.exits = [e for e in rec.exits if e[0] <= rec.steps]
        carry = states[rec.steps]
    rec.last = carry
    attribute_watch.refuse_changes(watch, site)
    hazards.refuse_updated(site, versions)
    return start


def program(island: Callable, ins: Sequence[str], outs: Sequence[str], where: Location, steps: int,
            reach: int = 0, resume: Sequence[str] | None = None,
            after: Sequence[tuple[Any, Callable]] = ()) -> Callable:
    """The statement function a chunk is captured from: `island(*ins)` with the loop unrolled,
    giving one output, (stops, exits, outs, next_ins): `stops` a 1-d bool tensor, per exit whose
    test is a tensor, whether it stops the loop (None where no test is a tensor); `exits` per
    possible stop, in order, (iterations done, its position in `stops` or None where it stops on
    every input, the break guard or -1); `outs` per exit the loop's outputs there; `next_ins` the
    loop's inputs after the chunk's last iteration, for the next chunk (the names `resume`, where
    `island` holds statements before the loop and the next chunk runs the loop alone; None where
    the chunk ends with a stop on every input). `after`: (StatementSpec, function) of the
    statements after the loop, run at each exit before its outputs are taken. (The capture gives each
    distinct tensor one program output: the outputs at successive exits share the lists' earlier
    items.)"""
    def chunk(*vals: Any) -> tuple:
        rec = Recorder(where.file, where.line, steps, reach)
        token = _RECORDER.set(rec)
        try:
            island(*vals)
        finally:
            _RECORDER.reset(token)
        if not rec.used:
            raise CaptureError("the loop's staged form is no `while_loop` a chunk can unroll", location=where)
        known = dict(zip(ins, vals))
        made = {n for st, _ in after for n in st.outs}
        lost = [n for n in outs if n not in rec.names and n not in known and n not in rec.env and n not in made]
        if lost:
            raise CaptureError(f"the loop's value `{lost[0]}` is not carried from one iteration to the next",
                               location=where)

        def named(state: tuple) -> dict[str, Any]:
            return {**known, **rec.env, **dict(zip(rec.names, state))}

        def finished(state: tuple) -> dict[str, Any]:  # the names after the statements after the loop
            env = named(state)
            for st, fn in after:
                env.update(zip(st.outs, fn(*[env[n] for n in st.ins])))
            return env

        flags: list[torch.Tensor] = []
        exits: list[tuple[int, int | None, int]] = []
        results = []
        for j, stop, g, state in rec.exits:
            if isinstance(stop, torch.Tensor):
                flags.append(stop)
            exits.append((j, len(flags) - 1 if isinstance(stop, torch.Tensor) else None, g))
            env = finished(state)  # (once per exit: the statements after the loop are traced there)
            results.append(tuple(env[n] for n in outs))
            hazards.refuse_shared_outputs(where, dict(zip(outs, results[-1])), known)
        last = named(rec.last)
        nxt = None if exits[-1][1] is None else tuple(last[n] for n in (ins if resume is None else resume))
        return ((torch.stack(flags) if flags else None, tuple(exits), results, nxt),)
    return chunk
