"""A `lax.cond` whose vmap keeps unbatched operands (the weights) unbatched."""
from __future__ import annotations

import contextlib
import math
import contextvars
from collections import Counter
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
from jax import custom_batching
from jax.extend.core import jaxpr_as_fun

from dycl_jax.lower.flops import flops

Branch = Callable[..., Any]

# While set, the vmap rule counts the conds it batches (at trace time, one per site traced):
# "select" or "loop" where the predicate is per-sample, "cond" where it is one value for the batch.
_COUNTS: contextvars.ContextVar[Counter | None] = contextvars.ContextVar("dycl_vmap_counts", default=None)
# While set, each branch of a cond with a per-sample predicate runs inside a cond on `any` of
# the samples taking it. Off by default: on the DyNN examples on XLA:CPU (scripts/bench_batch.py)
# the two extra conds per site cost more than the branches they skip (they split fusion).
_GUARDED: contextvars.ContextVar[bool] = contextvars.ContextVar("dycl_vmap_guarded", default=False)
# A cond with a per-sample predicate whose branches cost at least this many flops per sample
# (both together) runs as a loop over the samples, each through a real cond, instead of as a
# select over both branches. On the DyNN examples on XLA:CPU (scripts/bench_batch.py, batch 32)
# the loop wins where branches hold convolutions (0.5-3.5e6 flops: energy_selector 4.7x,
# skipnet_ff 1.45x faster), is even for small transformer layers (1.4e5) and loses on a few
# tiny matmuls (ACT's halting cell, 3e3 flops: 4.5x slower). `mapped()` / `selected()` force
# one or the other.
MAP_FLOPS = 3e5
_MAP_AT: contextvars.ContextVar[float] = contextvars.ContextVar("dycl_vmap_map_at", default=MAP_FLOPS)


@contextlib.contextmanager
def counting() -> Iterator[Counter]:
    """Count the conds that programs traced in the block batch as selects / keep as conds."""
    counts: Counter = Counter({"select": 0, "loop": 0, "cond": 0})
    token = _COUNTS.set(counts)
    try:
        yield counts
    finally:
        _COUNTS.reset(token)


@contextlib.contextmanager
def guarded() -> Iterator[None]:
    """Trace vmapped conds with per-sample predicates guarded: a branch no sample takes is skipped."""
    token = _GUARDED.set(True)
    try:
        yield
    finally:
        _GUARDED.reset(token)


@contextlib.contextmanager
def mapped(at: float = 0.0) -> Iterator[None]:
    """Trace vmapped conds with per-sample predicates as a loop over the samples where their
    branches cost at least `at` flops per sample (default: always)."""
    token = _MAP_AT.set(at)
    try:
        yield
    finally:
        _MAP_AT.reset(token)


def selected() -> contextlib.AbstractContextManager[None]:
    """Trace vmapped conds with per-sample predicates as selects over both branches (never a loop)."""
    return mapped(math.inf)


def _when(needed: jax.Array, fn: Branch, ops: tuple[Any, ...]) -> Any:
    """`fn(*ops)` if `needed`, else zeros of its output shapes (the caller selects them away).

    `fn` is traced once, to a jaxpr the cond replays, rather than once for its shapes and again
    for the cond: conds nest, and tracing twice per level would grow as 2**depth."""
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*ops)
    leaves, tree = jax.tree.flatten(shapes)
    run = jaxpr_as_fun(closed)
    outs = jax.lax.cond(needed, lambda o: run(*o), lambda o: [jnp.zeros(s.shape, s.dtype) for s in leaves], ops)
    return jax.tree.unflatten(tree, outs)


def _traced(fn: Branch, args: list[jax.ShapeDtypeStruct]) -> tuple[Any, Any]:
    """`fn`'s closed jaxpr at `args` and its output tree."""
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
    return closed, jax.tree.structure(shapes)


def _replay(closed: Any, tree: Any) -> Branch:
    run = jaxpr_as_fun(closed)
    return lambda *ops: jax.tree.unflatten(tree, run(*ops))


def _looped(p: jax.Array, closed_t: Any, closed_f: Any, ops: tuple[Any, ...], batched: list[bool]) -> list[Any]:
    """lax.map over the samples of a cond with a per-sample predicate: each sample runs only the
    branch it takes (a real cond); unbatched operands (the weights) stay shared."""
    picked = [i for i, b in enumerate(batched) if b]
    run_t, run_f = jaxpr_as_fun(closed_t), jaxpr_as_fun(closed_f)

    def one(xs: tuple) -> list[Any]:
        p_i, *mine = xs
        full = list(ops)
        for i, v in zip(picked, mine):
            full[i] = v
        return jax.lax.cond(p_i, lambda o: run_t(*o), lambda o: run_f(*o), full)

    return jax.lax.map(one, (p, *[ops[i] for i in picked]))


def batchable_cond(pred: jax.Array, true_fn: Branch, false_fn: Branch, operands: tuple[Any, ...]) -> Any:
    """`lax.cond(pred, true_fn, false_fn, *operands)` over array operands, with a vmap rule of its own.

    JAX vmaps a cond whose predicate is per-sample into a select over both branches, and first
    broadcasts *every* operand to the batch, the parameters included: a conv or matmul then runs
    with per-sample weights (a batched contraction, about 100x slower on CPU). This rule runs
    each branch under vmap with the operands batched as they arrive, so weights stay shared, and
    selects per sample (under `guarded()`, each branch only when some sample of the batch takes
    it). With an unbatched predicate it stays a cond.
    Its gradient is the plain cond's (custom_vmap has no autodiff rule of its own); forward-mode
    AD (jvp) is not defined.
    """

    def plain(p: jax.Array, *ops: Any) -> Any:
        return jax.lax.cond(p, true_fn, false_fn, *ops)

    @custom_batching.custom_vmap
    def vmappable(p: jax.Array, *ops: Any) -> Any:
        return plain(p, *ops)

    @vmappable.def_vmap
    def _rule(axis_size: int, in_batched: list[Any], p: jax.Array, *ops: Any) -> tuple[Any, Any]:
        p_batched, *ops_batched = in_batched  # one bool per operand: operands are arrays
        axes = tuple(0 if b else None for b in ops_batched)
        counts = _COUNTS.get()
        if not p_batched:
            if counts is not None:
                counts["cond"] += 1
            out = jax.vmap(lambda *o: plain(p, *o), in_axes=axes, axis_size=axis_size)(*ops)
            return out, jax.tree.map(lambda _: True, out)
        # each branch traced once, per sample: its cost decides loop or select, and both replay it
        one = [jax.ShapeDtypeStruct(o.shape[1:] if b else o.shape, o.dtype) for o, b in zip(ops, ops_batched)]
        (closed_t, tree), (closed_f, _) = _traced(true_fn, one), _traced(false_fn, one)
        looped = flops(closed_t.jaxpr) + flops(closed_f.jaxpr) >= _MAP_AT.get()
        if counts is not None:
            counts["loop" if looped else "select"] += 1
        if looped:
            out = jax.tree.unflatten(tree, _looped(p, closed_t, closed_f, ops, ops_batched))
        else:
            run_true = jax.vmap(_replay(closed_t, tree), in_axes=axes, axis_size=axis_size)
            run_false = jax.vmap(_replay(closed_f, tree), in_axes=axes, axis_size=axis_size)
            if _GUARDED.get():
                taken, other = _when(jnp.any(p), run_true, ops), _when(~jnp.all(p), run_false, ops)
            else:
                taken, other = run_true(*ops), run_false(*ops)
            out = jax.tree.map(lambda t, f: jnp.where(p.reshape((-1,) + (1,) * (t.ndim - 1)), t, f), taken, other)
        return out, jax.tree.map(lambda _: True, out)

    # Reverse mode: the forward runs the vmappable cond, the backward the plain cond's VJP
    # (recomputing the branch taken). A custom_jvp would not do: under grad of vmap its rule
    # is batched with JAX's select, whose stop_gradient on the tangents has no transpose.
    @jax.custom_vjp
    def cond(p: jax.Array, *ops: Any) -> Any:
        return vmappable(p, *ops)

    def _fwd(p: jax.Array, *ops: Any) -> tuple[Any, tuple[Any, ...]]:
        return vmappable(p, *ops), (p, ops)

    def _bwd(res: tuple[Any, ...], ct: Any) -> tuple[Any, ...]:
        p, ops = res
        _, vjp = jax.vjp(lambda *o: plain(p, *o), *ops)
        return (None, *vjp(ct))

    cond.defvjp(_fwd, _bwd)
    return cond(pred, *operands)
