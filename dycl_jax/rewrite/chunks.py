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
result is not used.
"""
from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from dycl_jax.errors import CaptureError, Location
from dycl_jax.rewrite import attribute_watch, lifting
from dycl_jax.rewrite.constants import static
from dycl_jax.rewrite.sites import Site


@dataclass
class Recorder:
    """What the chunked loop's `while_loop` saw: its carried names, the values after each iteration."""

    file: str
    line: int  # the user's `while` (a loop nested in its body is staged as usual)
    steps: int
    names: tuple[str, ...] = ()
    states: list[tuple] = field(default_factory=list)  # states[j]: after j iterations
    tests: list[Any] = field(default_factory=list)  # tests[j]: the test on states[j] (bool or 0-d tensor)
    used: bool = False


_RECORDER: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("dycl_chunk", default=None)


def pending(site: Site) -> Recorder | None:
    """The recorder waiting for this loop, or None (no chunk traced, or another loop)."""
    rec = _RECORDER.get()
    if rec is None or rec.used or site.line != rec.line or site.file != rec.file:
        return None
    rec.used = True
    return rec


def unroll(rec: Recorder, site: Site, test_fn: Callable, body_fn: Callable, carry: tuple, invariants: tuple,
           pred: Callable[[torch.Tensor], torch.Tensor]) -> tuple:
    """Trace `rec.steps` iterations straight into the graph, each test beside them; the loop's
    values as they came in (the island's result, which the chunk does not use)."""
    rec.names = site.names
    rec.states = [carry]
    # a module attribute or global the iterations change would leave the chunk at its value after
    # the last one, not at the stop's: refused as a staged loop body's change is (its host loop runs)
    watch = attribute_watch.snapshot(lifting.roots())
    for j in range(rec.steps + 1):
        test = static(test_fn(*carry, *invariants))
        rec.tests.append(pred(test) if isinstance(test, torch.Tensor) else bool(test))
        if rec.tests[-1] is False or j == rec.steps:  # (a Python False: the loop stops here on every input)
            break
        carry = tuple(body_fn(*carry, *invariants))
        rec.states.append(carry)
    attribute_watch.refuse_changes(watch, site)
    return rec.states[0]


def program(island: Callable, ins: Sequence[str], outs: Sequence[str], where: Location, steps: int) -> Callable:
    """The statement function a chunk is captured from: `island(*ins)` with the loop unrolled,
    giving one output, (stops, exits, outs, next_ins): `stops` a 1-d bool tensor, per tensor
    test, whether it stops the loop (None where no test is a tensor); `exits` per possible stop,
    in iteration order, (iteration, its position in `stops`, None where it stops on every input);
    `outs` per exit the loop's outputs after that iteration; `next_ins` the loop's inputs after
    the chunk's last iteration, for the next chunk. (The capture gives each distinct tensor one
    program output: the outputs after successive iterations share the lists' earlier items.)"""
    def chunk(*vals: Any) -> tuple:
        rec = Recorder(where.file, where.line, steps)
        token = _RECORDER.set(rec)
        try:
            island(*vals)
        finally:
            _RECORDER.reset(token)
        if not rec.used:
            raise CaptureError("the loop's staged form is no `while_loop` a chunk can unroll", location=where)
        known = dict(zip(ins, vals))
        lost = [n for n in outs if n not in rec.names and n not in known]
        if lost:
            raise CaptureError(f"the loop's value `{lost[0]}` is not carried from one iteration to the next",
                               location=where)

        def named(state: tuple) -> dict[str, Any]:
            return {**known, **dict(zip(rec.names, state))}

        flags: list[torch.Tensor] = []
        exits: list[tuple[int, int | None]] = []
        for j, test in enumerate(rec.tests):
            if isinstance(test, torch.Tensor):
                flags.append(torch.logical_not(test))
                exits.append((j, len(flags) - 1))
            elif not test:
                exits.append((j, None))
        results = [tuple(named(rec.states[j])[n] for n in outs) for j, _ in exits]
        last = named(rec.states[-1])
        return ((torch.stack(flags) if flags else None, tuple(exits), results, tuple(last[n] for n in ins)),)
    return chunk

