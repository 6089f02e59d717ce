"""A host statement computing data-dependent shapes (`nonzero`, masks) as numpy code: its ATen
graph for one input signature, emitted op by op, for the ops whose code takes no sizes (so
the graph traced on placeholder values computes every input of that signature exactly)."""
from __future__ import annotations

import ast
import operator
from typing import Any, Callable

import torch
from torch.fx.experimental.proxy_tensor import make_fx

aten = torch.ops.aten

_COMPARE = {aten.eq: "equal", aten.ne: "not_equal", aten.lt: "less", aten.le: "less_equal", aten.gt: "greater",
            aten.ge: "greater_equal"}
_LOGICAL = {aten.logical_and.default: "np.logical_and({0}, {1})", aten.logical_or.default: "np.logical_or({0}, {1})",
            aten.logical_not.default: "np.logical_not({0})", aten.bitwise_not.default: "np.invert({0})"}


def _text(node: torch.fx.Node, args: list[str]) -> str | None:
    """numpy code for one node, or None where its op has no size-free form here."""
    t = node.target
    if t is operator.getitem:
        return f"{args[0]}[{args[1]}]"
    packet = getattr(t, "overloadpacket", None)
    if packet in _COMPARE and t._overloadname in ("Scalar", "Tensor"):
        return f"np.{_COMPARE[packet]}({args[0]}, {args[1]})"
    if t in _LOGICAL:
        return _LOGICAL[t].format(*args)
    if t is aten.nonzero.default and node.args[0].meta["val"].dim() >= 1:
        return f"np.stack(np.nonzero({args[0]}), axis=1)"  # torch's [count, ndim] int64 layout
    if t is aten.unbind.int:
        return f"tuple(np.moveaxis({args[0]}, {args[1] if len(args) > 1 else 0}, 0))"
    if t is aten.select.int:
        return f"np.take({args[0]}, {args[2]}, axis={args[1]})"
    return None


def numpy_statement(fn: Callable[..., tuple], tensors: list[torch.Tensor], name: str) -> tuple[str | None, str]:
    """(`def name(*arrays): ...` computing `fn(*tensors)`'s tensor outputs with numpy, or None; why not)."""
    try:
        gm = make_fx(fn)(*tensors)
    except Exception as exc:  # noqa: BLE001 - the statement does not trace to ATen here: the reason is the refusal
        return None, f"it does not trace to ATen ops ({type(exc).__name__})"
    env: dict[torch.fx.Node, str] = {}
    params: list[str] = []
    lines: list[str] = []

    def ref(a: Any) -> str:
        if isinstance(a, torch.fx.Node):
            return env[a]
        if isinstance(a, (bool, int, float)) or a is None:
            return repr(a)
        raise TypeError(a)

    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = f"a{len(params)}"
            params.append(env[node])
            lines.append(f"    {env[node]} = np.asarray({env[node]})")
        elif node.op == "call_function":
            try:
                code = _text(node, [ref(a) for a in node.args])
            except TypeError:
                code = None
            if code is None or node.kwargs:
                return None, f"it computes {node.target} on the host, which has no numpy form here"
            env[node] = f"v{len(env)}"
            lines.append(f"    {env[node]} = {code}")
        elif node.op == "output":
            outs = node.args[0]
            if not all(isinstance(o, torch.fx.Node) for o in outs):
                # (`.tolist()`): traced on placeholder values, such a value would be a constant
                return None, "it gives Python values read from tensor values (e.g. `.tolist()`)"
            lines.append(f"    return ({''.join(ref(o) + ', ' for o in outs)})")
        else:
            return None, f"its graph holds a {node.op} node"
    text = f"def {name}({', '.join(params)}):\n" + "\n".join(lines)
    ast.parse(text)
    return text, ""
