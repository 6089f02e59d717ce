"""Margins of branch predicates in a lowered graph: how far each decision is from flipping.

See `dycl_jax.rewrite.decisions.Decision` for the definition. Computed from the values the
interpreter holds for the graph's nodes, only while decisions are recorded.
"""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import torch
import torch.fx

_aten = torch.ops.aten
_COMPARE = frozenset(
    getattr(getattr(_aten, op), overload)
    for op in ("gt", "ge", "lt", "le", "eq", "ne")
    for overload in ("Scalar", "Tensor")
)

_TRUE_AT_EQUALITY = (_aten.ge, _aten.le, _aten.eq)


def _value(arg: Any, env: dict) -> Any:
    return env[arg] if isinstance(arg, torch.fx.Node) else arg


def _logic(node: torch.fx.Node) -> bool:
    """Whether the node computes a boolean or integer tensor (a predicate's logic, a count)."""
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and not (val.is_floating_point() or val.is_complex())


def _distance(lhs: Any, rhs: Any, bump: Any = 0) -> Any:
    diff = jnp.abs(jnp.asarray(lhs, jnp.float32) - jnp.asarray(rhs, jnp.float32)) + bump
    return jnp.min(diff) if diff.size else jnp.asarray(jnp.inf, jnp.float32)


def _integral(v: Any) -> bool:
    return isinstance(v, (bool, int)) or hasattr(v, "dtype") and not jnp.issubdtype(v.dtype, jnp.inexact)


def _compare_margin(n: torch.fx.Node, env: dict) -> Any:
    """|lhs - rhs| of one comparison. Between integers a flip needs a whole step: where the result
    is the one the comparison gives at equality (`2 > 2` is False, so is `1 > 2`), one more."""
    lhs, rhs = _value(n.args[0], env), _value(n.args[1], env)
    if not (_integral(lhs) and _integral(rhs)):
        return _distance(lhs, rhs)
    at_equality = n.target._overloadpacket in _TRUE_AT_EQUALITY
    return _distance(lhs, rhs, (env[n] == at_equality).astype(jnp.float32))


def margin(node: Any, env: dict) -> Any:
    """The margin of the predicate `node` (a 0-d float32 array), or None if it has none."""
    if not isinstance(node, torch.fx.Node):
        return None
    found: list[Any] = []
    seen: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in seen or n.op != "call_function" or n not in env:
            continue
        seen.add(n)
        if n.target in _COMPARE:
            found.append(_compare_margin(n, env))
        # a count compared is as close to flipping as the tests it counts
        if n.target in _COMPARE or _logic(n):
            stack.extend(a for a in n.all_input_nodes if a.op != "call_function" or a.target in _COMPARE or _logic(a))
    if not found:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.is_floating_point() and node in env:
            return _distance(env[node], 0.0)  # a float tested for truth: its distance from 0
        return None
    return jnp.min(jnp.stack(found))


def output_margins(output_node: torch.fx.Node, env: dict) -> tuple[Any, ...]:
    """Per output of the graph: the margin of a one-element boolean output, else None."""
    outs = output_node.args[0]
    outs = outs if isinstance(outs, (list, tuple)) else (outs,)
    result = []
    for o in outs:
        val = o.meta.get("val") if isinstance(o, torch.fx.Node) else None
        is_pred = isinstance(val, torch.Tensor) and val.dtype == torch.bool and val.numel() == 1
        result.append(margin(o, env) if is_pred else None)
    return tuple(result)
