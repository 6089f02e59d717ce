"""A `lax.cond` whose vmap keeps unbatched operands (the weights) unbatched."""
from __future__ import annotations

import contextlib
import contextvars
from collections import Counter
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
from jax import custom_batching
from jax.extend.core import jaxpr_as_fun

Branch = Callable[..., Any]

# While set, the vmap rule counts the conds it batches (at trace time, one per site traced):
# "select" where the predicate is per-sample, "cond" where it is one value for the batch.
_COUNTS: contextvars.ContextVar[Counter | None] = contextvars.ContextVar("dycl_vmap_counts", default=None)
# While set, each branch of a cond with a per-sample predicate runs inside a cond on `any` of
# the samples taking it. Off by default: on the DyNN examples on XLA:CPU (scripts/bench_batch.py)
# the two extra conds per site cost more than the branches they skip (they split fusion).
_GUARDED: contextvars.ContextVar[bool] = contextvars.ContextVar("dycl_vmap_guarded", default=False)


@contextlib.contextmanager
def counting() -> Iterator[Counter]:
    """Count the conds that programs traced in the block batch as selects / keep as conds."""
    counts: Counter = Counter({"select": 0, "cond": 0})
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


def _when(needed: jax.Array, fn: Branch, ops: tuple[Any, ...]) -> Any:
    """`fn(*ops)` if `needed`, else zeros of its output shapes (the caller selects them away).

    `fn` is traced once, to a jaxpr the cond replays, rather than once for its shapes and again
    for the cond: conds nest, and tracing twice per level would grow as 2**depth."""
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*ops)
    leaves, tree = jax.tree.flatten(shapes)
    run = jaxpr_as_fun(closed)
    outs = jax.lax.cond(needed, lambda o: run(*o), lambda o: [jnp.zeros(s.shape, s.dtype) for s in leaves], ops)
    return jax.tree.unflatten(tree, outs)


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
        if counts is not None:
            counts["select" if p_batched else "cond"] += 1
        if not p_batched:
            out = jax.vmap(lambda *o: plain(p, *o), in_axes=axes, axis_size=axis_size)(*ops)
        else:
            run_true = jax.vmap(true_fn, in_axes=axes, axis_size=axis_size)
            run_false = jax.vmap(false_fn, in_axes=axes, axis_size=axis_size)
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
