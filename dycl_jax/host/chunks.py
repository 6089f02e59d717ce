"""The dispatch host's loops run in chunks of iterations (rewrite/chunks.py): one program and one
host read per `STEPS` iterations instead of per iteration (or one per loop, where it stops on every
input within `REACH` iterations), exact as the loop is.

A chunk program is an island of its own (`chunk_spec`), captured, compiled and cached per input
signature as islands are: a decode loop that grows its sequence has one program per chunk start
(the sequence's length then), made once and reused by later calls. The host reads the chunk's
stop flags and keeps the loop's outputs at the first iteration whose test stops it; past the
chunk's last iteration it starts the next chunk from the values there. Where a chunk does not
stage (a capture refused, a new int value seen once: host/specialised.py), the loop runs as a
host loop from its start: the chunks run so far changed nothing outside their outputs. The host
loop also runs once per new path (`run`), so the regions an emitted or exported host runs the
loop with exist for every path the live host took.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from dycl_jax.lower.dtypes import INT32_MAX, INT32_MIN
from dycl_jax.rewrite import chunks
from dycl_jax.rewrite.regions import NOT_STAGED, RegionSpec

# iterations per chunk: a decode loop of n steps takes ceil(n / STEPS) programs and computes at
# most STEPS - 1 iterations past its stop
STEPS = 4
# a loop that stops on every input within REACH iterations (a Python bound, `step >= max_len`)
# runs to that stop in one chunk: as many iterations as the staged host's padded loop computes
REACH = 8
OUT = "_dycl_chunk"  # the chunk island's one output (chunks.program)

def chunk_spec(spec: RegionSpec) -> RegionSpec:
    """The island a chunk of `spec`'s loop is captured as: the loop's inputs in, one output (the
    loop's in-place names are written back only from the final outputs, `run`). The dispatch
    host keeps one per loop (`DispatchHost.chunk_loops`): its identity keys the island's state."""
    st = spec.statements[0]
    return dataclasses.replace(spec, statements=(dataclasses.replace(st, outs=(OUT,)),), outs=(OUT,),
                               kind="island", in_place=frozenset())


def resume_spec(spec: RegionSpec) -> RegionSpec:
    """The island the later chunks of `spec`'s loop are captured as: `chunk_spec`, or where the
    first chunk holds statements before the loop (`RegionSpec.resume`), the loop alone taking
    the names `resume`."""
    island = chunk_spec(spec)
    if spec.resume is None:
        return island
    st = dataclasses.replace(island.statements[0], ins=spec.resume)
    return dataclasses.replace(island, statements=(st,), ins=spec.resume, resume=None)


def is_chunk(spec: RegionSpec) -> bool:
    """Whether `spec` is the island a loop's chunks are captured as (`chunk_spec`)."""
    return spec.outs == (OUT,)


def run(host: Any, spec: RegionSpec, islands: tuple[RegionSpec, RegionSpec],
        fns: tuple[Callable, Callable | None, tuple[Callable, ...]], vals: tuple, seen: set,
        finish: Callable[[tuple], tuple]) -> Any:
    """The loop's outputs, chunk after chunk through the dispatch host's `run_island`, or
    NOT_STAGED: the first chunk of `islands[0]` (`chunk_spec`) from `fns[0]`, the later ones of
    `islands[1]` (`resume_spec`) from `fns[1]` where the first holds statements before the loop;
    each runs the statements after the loop (`fns[2]`, `RegionSpec.after`) once per exit.

    A path (the loop's input signature, as the first chunk's program stands for it, its number
    of iterations and the break that stopped it) the host loop has not run yet gives NOT_STAGED once, after the chunks
    found it (`seen` keeps those it ran): the host loop then compiles its regions at that path's
    signatures, which an emitted or exported host, running the host loop, serves (emit/,
    runtime/hosted.py). A chunk that ran its first call (captured then, `host.last_program` not
    set) counts as a new path. `finish` gives the loop's outputs its lists and dicts as the
    caller's objects, as an island's outputs get them (the chunks' own outputs are new objects)."""
    where = dataclasses.replace(spec.location, line=spec.loop_line)  # (the recorder waits for the loop's line)
    after = tuple(zip(spec.after, fns[2]))
    first = chunks.program(fns[0], spec.ins, spec.outs, where, STEPS, REACH, spec.resume, after)
    later = first if fns[1] is None else \
        chunks.program(fns[1], islands[1].ins, spec.outs, where, STEPS, REACH, after=after)
    current, done, start = vals, 0, None
    while True:
        host.last_program = None
        got = host.run_island(islands[1] if done else islands[0], later if done else first, current)
        if got is NOT_STAGED:
            return NOT_STAGED
        if not done:
            start = host.last_program  # (a program is kept by its part's cache: its id is not reused)
        stops, exits, outs, current = got[0]
        flags = np.asarray(stops) if stops is not None else None  # the chunk's one host read
        for (j, k, g), out in zip(exits, outs):
            if k is None or flags[k]:  # type: ignore[index]
                path = (id(start), done + j, g)
                if start is None or path not in seen:
                    if start is not None:
                        seen.add(path)
                    return NOT_STAGED
                return finish(_narrowed(spec, vals, out))
        done += STEPS


def _narrowed(spec: RegionSpec, vals: tuple, outs: tuple) -> tuple:
    """The loop's outputs, an int64 array that came in as int32 (`seqs` a region made) int32 again
    where its values fit: a chunk in JAX's 64-bit scope (a counter its int range analysis cannot
    bound) gives int64 where the host loop's regions give int32, and the code after the loop
    would compile again for the other dtype."""
    start = dict(zip(spec.ins, vals))
    got = list(outs)
    for k, n in enumerate(spec.outs):
        was, now = start.get(n), got[k]
        if isinstance(now, jax.Array) and now.dtype == np.int64 and isinstance(was, jax.Array) \
                and was.dtype == np.int32:
            a = np.asarray(now)
            if a.size == 0 or INT32_MIN <= a.min() and a.max() <= INT32_MAX:
                got[k] = jax.numpy.asarray(a.astype(np.int32))  # (a JAX array, as the regions' outputs are)
    return tuple(got)
