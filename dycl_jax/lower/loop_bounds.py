"""Finds a static trip-count bound of a torch.while_loop (a counter tested against a constant)."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx

aten = torch.ops.aten
# Ops that pass a value through unchanged (for this analysis).
_TRANSPARENT = {
    aten.clone.default, aten.view.default, aten.alias.default, aten._to_copy.default,
    aten.lift_fresh_copy.default, aten.reshape.default, aten.squeeze.default, aten.squeeze.dims,
}
_AND = {aten.logical_and.default, aten.bitwise_and.Tensor, aten.__and__.Tensor, aten.mul.Tensor}


def _strip(n: Any) -> Any:
    while isinstance(n, torch.fx.Node) and n.op == "call_function" and n.target in _TRANSPARENT:
        n = n.args[0]
    return n


def _conjuncts(n: Any) -> list[Any]:
    n = _strip(n)
    if isinstance(n, torch.fx.Node) and n.op == "call_function" and n.target in _AND:
        return _conjuncts(n.args[0]) + _conjuncts(n.args[1])
    return [n]


def _output(gm: torch.fx.GraphModule) -> list[Any]:
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _placeholder_index(gm: torch.fx.GraphModule, n: Any) -> int | None:
    phs = [p for p in gm.graph.nodes if p.op == "placeholder"]
    return phs.index(n) if n in phs else None


def _limits(cond_gm: torch.fx.GraphModule) -> list[tuple[int, float]]:
    """(carry index, exclusive upper limit) for each `counter < C` / `counter <= C` conjunct."""
    found = []
    for c in _conjuncts(_output(cond_gm)[0]):
        if not (isinstance(c, torch.fx.Node) and c.op == "call_function"):
            continue
        if c.target in (aten.lt.Scalar, aten.le.Scalar) and isinstance(c.args[1], (int, float)):
            j = _placeholder_index(cond_gm, _strip(c.args[0]))
            if j is not None:
                found.append((j, c.args[1] + (1 if c.target == aten.le.Scalar else 0)))
    return found


def _step(body_gm: torch.fx.GraphModule, j: int) -> float | None:
    """The constant a body adds to carry j each iteration, if that is all it does to it."""
    out = _strip(_output(body_gm)[j])
    if not (isinstance(out, torch.fx.Node) and out.op == "call_function"):
        return None
    if out.target in (aten.add.Tensor, aten.add.Scalar) and not out.kwargs.get("alpha", 1) != 1:
        a, b = out.args[0], out.args[1]
        for x, k in ((a, b), (b, a)):
            if isinstance(k, (int, float)) and _placeholder_index(body_gm, _strip(x)) == j:
                return float(k)
    return None


def _initial(n: Any) -> float | None:
    n = _strip(n)
    if isinstance(n, torch.fx.Node) and n.op == "call_function":
        if n.target == aten.full.default and isinstance(n.args[1], (int, float)):
            return float(n.args[1])
        if n.target == aten.scalar_tensor.default and isinstance(n.args[0], (int, float)):
            return float(n.args[0])
    return None


def static_trip_bound(node: torch.fx.Node, gm: torch.fx.GraphModule) -> int | None:
    """An upper bound on the iterations of while_loop `node`, or None if none is evident.

    Sound only for the pattern it matches: the loop test is a conjunction containing
    `counter < C` (or <=), the body adds a positive constant to that counter and nothing else,
    and the counter starts from a constant. Then the loop runs at most ceil((C - start) / step).
    """
    cond_gm = getattr(gm, str(node.args[0].target))
    body_gm = getattr(gm, str(node.args[1].target))
    carried = node.args[2]
    bounds = []
    for j, limit in _limits(cond_gm):
        if j >= len(carried):  # a loop invariant (`t < C` with `t` never changed): no counter
            continue
        step, start = _step(body_gm, j), _initial(carried[j])
        if step is not None and step > 0 and start is not None:
            bounds.append(max(0, math.ceil((limit - start) / step)))
    return min(bounds) if bounds else None
