"""A host statement computing data-dependent shapes (`nonzero`, masks) or Python values (`.tolist()`)
as numpy code: its ATen graph for one input signature, emitted op by op, for the ops whose code
takes no sizes (so the graph traced on placeholder values computes every input of that signature
exactly)."""
from __future__ import annotations

import ast
import operator
from typing import Any, Callable

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.overrides import TorchFunctionMode

aten = torch.ops.aten

_COMPARE = {aten.eq: "equal", aten.ne: "not_equal", aten.lt: "less", aten.le: "less_equal", aten.gt: "greater",
            aten.ge: "greater_equal"}
_LOGICAL = {aten.logical_and.default: "np.logical_and({0}, {1})", aten.logical_or.default: "np.logical_or({0}, {1})",
            aten.logical_not.default: "np.logical_not({0})", aten.bitwise_not.default: "np.invert({0})"}


_ARITHMETIC = {aten.add: "add", aten.sub: "subtract", aten.mul: "multiply"}


def _same_dtype(node: torch.fx.Node) -> bool:
    """numpy computes the node in torch's dtype: every tensor operand has the result's dtype and a
    Python scalar is weak (numpy 2's rule too), an integer one only for an integer result."""
    want = node.meta["val"].dtype
    for a in node.args:
        if isinstance(a, torch.fx.Node):
            if a.meta["val"].dtype != want:
                return False
        elif isinstance(a, float) and not want.is_floating_point or not isinstance(a, (int, float)):
            return False
    return True


class ListUsed(Exception):
    """The statement computes with a `.tolist()` value (`max(t.tolist())`): traced on placeholder
    values, that Python code would be baked in as a constant."""


class _Listed:
    """`t.tolist()` while the statement is traced: the host converts the array `t` to Python values."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def _used(self, *_: Any) -> Any:
        raise ListUsed

    __iter__ = __len__ = __getitem__ = __bool__ = __index__ = __int__ = __float__ = _used


class _KeepLists(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        if func is torch.Tensor.tolist:
            return _Listed(args[0])  # any use but returning it fails the trace (and the statement is refused)
        return func(*args, **(kwargs or {}))


def _text(node: torch.fx.Node, args: list[str]) -> str | None:
    """numpy code for one node, or None where its op has no size-free form here."""
    t = node.target
    if t is operator.getitem:
        return f"{args[0]}[{args[1]}]"
    packet = getattr(t, "overloadpacket", None)
    if packet in _ARITHMETIC and t._overloadname in ("Scalar", "Tensor") and _same_dtype(node):
        return f"np.{_ARITHMETIC[packet]}({args[0]}, {args[1]})"
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
    listed: set[int] = set()  # the outputs that are `.tolist()` of an array

    def traced(*arrays: torch.Tensor) -> tuple:
        with _KeepLists():
            outs = fn(*arrays)
        listed.clear()
        listed.update(k for k, o in enumerate(outs) if isinstance(o, _Listed))
        return tuple(o.tensor if isinstance(o, _Listed) else o for o in outs)

    try:
        gm = make_fx(traced)(*tensors)
    except ListUsed:
        return None, "it computes with the Python values of a `.tolist()` inside the statement"
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
                # (`.item()`, `int(t)`): traced on placeholder values, such a value would be a constant
                return None, "it gives Python values read from tensor values other than by a final `.tolist()`"
            texts = [ref(o) + (".tolist()" if k in listed else "") for k, o in enumerate(outs)]
            lines.append(f"    return ({''.join(t + ', ' for t in texts)})")
        else:
            return None, f"its graph holds a {node.op} node"
    text = f"def {name}({', '.join(params)}):\n" + "\n".join(lines)
    ast.parse(text)
    return text, ""
