"""One function body as text: values named after the user's variables, single-use values inlined,
module calls as attribute calls, `torch.cond`/`while_loop` as `jax.lax` control flow."""
from __future__ import annotations

import ast
import re
import inspect
import operator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.fx

from dycl_jax.emit import hierarchy
from dycl_jax.emit.ops import KEYS, NO_VALUE, RANDOM, RULES, Expr, lit
from dycl_jax.errors import DyclError, Location
from dycl_jax.lower.interpreter import node_frames, node_location, node_site

if TYPE_CHECKING:
    from dycl_jax.emit.program import Program

_HOPS = (torch.ops.higher_order.cond, torch.ops.higher_order.while_loop)
_NP = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: "bfloat16", torch.int64: np.int32,
       torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8, torch.uint8: np.uint8, torch.bool: np.bool_}
_PY_OPS = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.floordiv: "//", operator.mod: "%",
           operator.truediv: "/"}
RESERVED = {"self", "jax", "jnp", "nnx", "np", "conv_nchw", "Buffer", "load", "rngs", "carry", "key", KEYS,
            "dropout", "RandomKeys", "loop_key"}


def _np_dtype(val: Any) -> Any:
    return np.dtype(_NP[val.dtype]) if isinstance(val, torch.Tensor) and val.dtype in _NP else None


def assigned_names(loc: Location | None) -> list[str]:
    """The names a user line assigns (`out = ...` → [out]; `a, b = ...` → [a, b]), else []."""
    if loc is None or not loc.code:
        return []
    try:
        stmt = ast.parse(loc.code.strip()).body[0]
    except (SyntaxError, IndexError):
        return []
    target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else (
        stmt.target if isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) else None)
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
        return [e.id for e in target.elts]
    return []


def _refs(value: Any) -> list[torch.fx.Node]:
    out: list[torch.fx.Node] = []
    torch.fx.node.map_arg(value, lambda n: out.append(n))
    return out


@dataclass
class Body:
    """The statements of one function: `lines` (unindented), names bound so far."""

    program: "Program"
    context: str  # module path whose `self` the body runs in
    gm: torch.fx.GraphModule
    env: dict[torch.fx.Node, Expr] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    holder: dict[str, Any] = field(default_factory=dict)  # name -> node it holds now
    last_use: dict[Any, int] = field(default_factory=dict)
    reserved: set[str] = field(default_factory=set)
    step: int = 0
    keyed: bool = False  # the body draws random numbers (itself, in a branch, or in a call): it reads `keys`

    # ---- names -------------------------------------------------------------------------
    def fresh(self, wanted: str, node: Any) -> str:
        base = wanted if wanted.isidentifier() and wanted not in RESERVED else f"v_{wanted}".replace(".", "_")
        name, k = base, 1
        while name in self.reserved or (name in self.holder and self.last_use.get(self.holder[name], -1) > self.step):
            name, k = f"{base}_{k}", k + 1
        self.holder[name] = node
        return name

    def bind(self, node: Any, expr: str, wanted: str) -> Expr:
        if expr.isidentifier():  # another node for the same value (a clone, an item): the name lives on
            if expr in self.holder:
                held = self.holder[expr]
                self.last_use[held] = max(self.last_use.get(held, -1), self.last_use.get(node, -1))
            return Expr(expr)
        name = self.fresh(wanted, node)
        self.lines.append(f"{name} = {expr}")
        return Expr(name)

    # ---- values ------------------------------------------------------------------------
    def value(self, v: Any) -> Any:
        """An argument as emission text: nodes by their expression, other values as they are."""
        if isinstance(v, torch.fx.Node):
            if v in self.env:
                return self.env[v]
            state = self.program.state_of(v)
            if state is not None:
                return Expr(self.program.state_expr(state, self.context))
            raise AssertionError(f"value {v.name} used before it is emitted")
        if isinstance(v, (list, tuple)):
            return type(v)(self.value(x) for x in v)
        return v

    def run(self, items: list[hierarchy.Item], outputs: list[Any]) -> list[Any]:
        """Emit `items`; returns the expressions of `outputs` (nodes or constants)."""
        order: dict[Any, int] = {}
        users: dict[torch.fx.Node, list[int]] = {}
        for i, item in enumerate(items):
            for ref in self._inputs(item):
                users.setdefault(ref, []).append(i)
        end = len(items)
        for ref in _refs(outputs):
            users.setdefault(ref, []).append(end)
        for n, idx in users.items():
            self.last_use[n] = max(idx)
        line_of = {i: self._line(item) for i, item in enumerate(items)}
        for i, item in enumerate(items):
            self.step = i
            order[item if isinstance(item, torch.fx.Node) else id(item)] = i
            if isinstance(item, hierarchy.Call):
                self._call(item, users, line_of, i)
            else:
                self._node(item, users, line_of, i)
        self.step = end
        return [self.value(o) for o in outputs]

    def _inputs(self, item: hierarchy.Item) -> list[torch.fx.Node]:
        if isinstance(item, torch.fx.Node):
            return [r for r in _refs((item.args, item.kwargs))]
        inside = set(item.nodes)
        return [r for n in item.nodes for r in _refs((n.args, n.kwargs)) if r not in inside]

    def _line(self, item: hierarchy.Item) -> Location | None:
        if isinstance(item, torch.fx.Node):
            return node_location(item)
        return self.program.call_location(item)

    def _pending_ok(self, node: torch.fx.Node, users: dict, line_of: dict, i: int) -> bool:
        # a value used once, later on the same user line, is written inside its user's expression
        use = users.get(node, [])
        if len(use) != 1 or use[0] >= len(line_of) or use[0] <= i:
            return False
        here, there = line_of[i], line_of[use[0]]
        return here is not None and there is not None and (here.file, here.line) == (there.file, there.line)

    def _publish(self, node: torch.fx.Node, expr: str, users: dict, line_of: dict, i: int, named: bool = False) -> None:
        if not named and self._pending_ok(node, users, line_of, i):
            self.env[node] = Expr(f"({expr})" if not _atomic(expr) else expr)
            for n, held in list(self.holder.items()):  # names read by the pending text stay live until its use
                if n in expr:
                    self.last_use[held] = max(self.last_use.get(held, -1), users[node][0])
            return
        names = assigned_names(line_of[i])
        result_of_line = all(line_of.get(u) is None or line_of[u] != line_of[i] for u in users.get(node, []))
        wanted = names[0] if len(names) == 1 and result_of_line else _op_name(node)
        self.env[node] = self.bind(node, expr, wanted)

    # ---- nodes -------------------------------------------------------------------------
    def _node(self, node: torch.fx.Node, users: dict, line_of: dict, i: int) -> None:
        target = node.target
        if target in NO_VALUE:
            return
        if target in _HOPS:
            from dycl_jax.emit.control import emit_control  # control flow nests bodies
            emit_control(self, node, users, line_of, i)
            return
        if target is operator.getitem:
            src, k = node.args
            parts = self.env.get(src)
            if isinstance(parts, tuple) and isinstance(k, int) and 0 <= k < len(parts) and parts[k] is not None:
                # cond / while outputs, or a tuple op's item; a random op's value gets a name, so
                # keys are drawn in statement order (the program's)
                self._publish(node, parts[k], users, line_of, i, named=src.target in RANDOM and f"{KEYS}()" in parts[k])
                return
            raise self.program.no_rule(node, f"item {k} of {getattr(src.target, '__name__', src.target)}")
        if target in _PY_OPS:
            a, b = (lit(self.value(x)) for x in node.args)
            self._publish(node, f"{a} {_PY_OPS[target]} {b}", users, line_of, i)
            return
        r = RULES.get(target)
        if r is None:
            raise self.program.no_rule(node, str(target))
        args = self.value(node.args)
        kwargs = {k: self.value(v) for k, v in node.kwargs.items() if k not in ("device", "pin_memory", "layout",
                                                                              "memory_format", "non_blocking")}
        if r.named is True or (callable(r.named) and r.named(node)):  # the text repeats an argument: name it first
            args = tuple(self._named(a) for a in args)
        try:
            text = r.text(*args, **kwargs, **({"node": node} if r.node else {}))
        except (KeyError, TypeError) as exc:
            raise self.program.no_rule(node, f"{target} with these arguments ({exc})") from None
        drawn = target in RANDOM and f"{KEYS}()" in text
        self.keyed |= drawn
        if isinstance(text, tuple):  # a list-valued op (split): one text per item
            self.env[node] = tuple(Expr(t) for t in text)
            return
        if r.parts:
            self.env[node] = tuple(Expr(text) if k in r.parts else None for k in range(max(r.parts) + 3))
            return
        self._publish(node, self._cast(node, text, r.dtype), users, line_of, i, named=drawn)

    def _named(self, a: Any, wanted: str = "t") -> Any:
        if isinstance(a, Expr) and not a.isidentifier() and not a.startswith("self."):
            token = object()  # live through the statement being written: two arguments, two names
            self.last_use[token] = self.step + 1
            name = self.fresh(wanted, token)
            self.lines.append(f"{name} = {a}")
            return Expr(name)
        return a

    def _cast(self, node: torch.fx.Node, text: str, mode: str) -> str:
        want = _np_dtype(node.meta.get("val"))
        if want is None or mode == "own":
            return text
        tensors = [_np_dtype(a.meta.get("val")) for a in _refs(node.args)]
        tensors = [t for t in tensors if t is not None]
        if not tensors:
            return text
        if mode == "promote":
            scalars = [a for a in node.args if isinstance(a, (bool, int, float))]
            have = np.dtype(jnp_result_type(*tensors, *scalars))
        else:
            have = tensors[0]
        return text if have == want else f"({text}).astype(jnp.{'bool_' if want == np.bool_ else want.name})"

    # ---- module calls ------------------------------------------------------------------
    def _call(self, call: hierarchy.Call, users: dict, line_of: dict, i: int) -> None:
        inputs, outputs = call_io(call, self.program.state_of)
        layer = self.program.layer_of(call)
        ref = self.program.ref(layer.path if layer is not None else call.path, self.context)
        # a layer takes its one array: sizes the graph passes in (a batch-sized view's `B * T`) it reads itself
        arrays = [a for a in inputs if isinstance(a.meta.get("val"), torch.Tensor)]
        if layer is not None and len(outputs) == 1 and len(arrays) == 1:
            self._publish(outputs[0], layer.call(ref, lit(self.value(arrays[0]))), users, line_of, i)
            return
        args = ", ".join([lit(self._named(self.value(a))) for a in inputs]
                         + ([KEYS] if call.path in self.program.keyed_calls else []))
        self.keyed |= call.path in self.program.keyed_calls
        text = f"{ref}({args})"
        names = assigned_names(line_of[i])
        if len(outputs) == 1:
            self._publish(outputs[0], text, users, line_of, i)
            return
        wanted = names if len(names) == len(outputs) else [_op_name(o) for o in outputs]
        bound = [self.fresh(w, o) for w, o in zip(wanted, outputs)]
        self.lines.append(f"{', '.join(bound)} = {text}")
        for o, b in zip(outputs, bound):
            self.env[o] = Expr(b)


def _op_name(node: torch.fx.Node) -> str:
    # torch numbers node names per graph (relu_4); the same code in two instances must read alike
    return re.sub(r"_\d+$", "", node.name).lstrip("_") or "v"


def call_io(call: hierarchy.Call, state_of: Any) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """A call's inputs (values from outside it, in order of first use; state excluded) and outputs."""
    inside = set(call.nodes)
    inputs = list(dict.fromkeys(r for n in call.nodes for r in _refs((n.args, n.kwargs))
                                if r not in inside and state_of(r) is None and r.op != "get_attr"))
    outputs = [n for n in call.nodes if any(u not in inside for u in n.users)]
    return inputs, outputs


def _atomic(expr: str) -> bool:
    return expr.isidentifier() or expr.replace(".", "").replace("_", "").isalnum() or (
        expr.endswith(")") and expr.count("(") == 1 and expr.split("(")[0].replace(".", "").replace("_", "").isalnum())


def jnp_result_type(*args: Any) -> Any:
    import jax.numpy as jnp  # JAX's promotion, the one the emitted code will see
    return jnp.result_type(*[np.dtype(a) if isinstance(a, (np.dtype, type)) else a for a in args])


def forward_params(cls: type | None, n: int) -> list[str] | None:
    """The parameter names of `cls.forward` when it takes exactly `n` arguments after self."""
    fn = getattr(cls, "forward", None)
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()][1:] if fn else []
    except (TypeError, ValueError):
        return None
    return params if len(params) == n and all(p.isidentifier() for p in params) else None


__all__ = ["Body", "assigned_names", "node_frames", "node_site", "forward_params", "DyclError"]
