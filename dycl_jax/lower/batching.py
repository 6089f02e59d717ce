"""A `lax.cond` whose vmap keeps unbatched operands (the weights) unbatched."""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax import custom_batching

Branch = Callable[..., Any]


def batchable_cond(pred: jax.Array, true_fn: Branch, false_fn: Branch, operands: tuple[Any, ...]) -> Any:
    """`lax.cond(pred, true_fn, false_fn, *operands)` over array operands, with a vmap rule of its own.

    JAX vmaps a cond whose predicate is per-sample into a select over both branches, and first
    broadcasts *every* operand to the batch, the parameters included: a conv or matmul then runs
    with per-sample weights (a batched contraction, about 100x slower on CPU). This rule runs
    each branch under vmap with the operands batched as they arrive, so weights stay shared, and
    selects per sample. With an unbatched predicate it stays a cond. Its gradient is the plain
    cond's (custom_vmap has no autodiff rule of its own); forward-mode AD (jvp) is not defined.
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
        if not p_batched:
            out = jax.vmap(lambda *o: plain(p, *o), in_axes=axes, axis_size=axis_size)(*ops)
        else:
            taken = jax.vmap(true_fn, in_axes=axes, axis_size=axis_size)(*ops)
            other = jax.vmap(false_fn, in_axes=axes, axis_size=axis_size)(*ops)
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

