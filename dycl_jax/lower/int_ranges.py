"""Integer value ranges of a captured graph: can an int64 value leave int32?

dycl_jax holds torch.int64 as int32 unless that could change a result. This analysis bounds
every integer value of the graph by interval arithmetic (inputs within int32, as the call
checks; buffers by their actual values; indices and sizes below 2**31; sums by the number of
elements summed) and reports the first int64 value that may leave int32. Anything it does not
know (an unlisted op, a float cast to int64, a loop counter without a trip bound) counts as
unbounded: the verdict errs towards 64-bit integers, never towards wrapping.
"""
from __future__ import annotations

import contextlib
import math
import operator
import os
from dataclasses import dataclass
from typing import Any, Callable

import jax
import torch
import torch.fx

from dycl_jax.lower.dtypes import INT32_MAX, INT32_MIN
from dycl_jax.lower.loop_bounds import static_trip_bound

aten = torch.ops.aten
Interval = tuple[float, float]  # (lo, hi), ints or ±inf
_FULL: Interval = (-math.inf, math.inf)
_SIZE: Interval = (0, INT32_MAX - 1)  # sizes, element counts, indices (no tensor holds 2**31 elements)
_OF_DTYPE: dict[torch.dtype, Interval] = {
    torch.bool: (0, 1), torch.uint8: (0, 255), torch.int8: (-128, 127), torch.int16: (-(2**15), 2**15 - 1),
    torch.int32: (INT32_MIN, INT32_MAX), torch.int64: _FULL,
}


@dataclass
class Verdict:
    """Whether the program needs 64-bit integers, and the first value that does (for the report)."""

    wide: bool
    node: torch.fx.Node | None = None
    why: str = ""


def _hull(*ivs: Interval | None) -> Interval:
    known = [iv for iv in ivs if iv is not None]
    return (min(iv[0] for iv in known), max(iv[1] for iv in known)) if known else _FULL


def _mul(a: Interval, b: Interval) -> Interval:
    products = [x * y for x in a for y in b if not (x == 0 and math.isinf(y) or y == 0 and math.isinf(x))]
    return (min(products), max(products)) if products else (0, 0)


def _scaled(a: Interval, n: float) -> Interval:
    """Sum of up to `n` values in `a` (and of none: 0)."""
    return (min(0, a[0] * n), max(0, a[1] * n))


def _numel(v: Any) -> float:
    shape = getattr(v, "shape", None)
    if shape is None or not all(isinstance(d, int) for d in shape):
        # a symbolic size (`int()` of it would guard on the example's value, or fail for a
        # data-dependent one): no tensor holds 2**31 elements or more
        return float(INT32_MAX)
    return float(math.prod(shape))


def _val(x: Any) -> Any:
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else x


def _int_dtype(v: Any) -> torch.dtype | None:
    if isinstance(v, torch.Tensor) and not v.dtype.is_floating_point and not v.dtype.is_complex:
        return v.dtype
    return None


class _Analysis:
    def __init__(self) -> None:
        self.first: tuple[torch.fx.Node, str] | None = None

    # ------------------------------------------------------------ graphs

    def graph(self, gm: torch.fx.GraphModule, inputs: list[Any]) -> list[Any]:
        """Intervals of the graph's outputs given those of its placeholders (None: not an integer)."""
        env: dict[torch.fx.Node, Any] = {}
        ins = iter(inputs)
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(ins, None)
            elif node.op == "get_attr":
                env[node] = _constant(getattr(gm, node.target, None))
            elif node.op == "call_function":
                env[node] = self.node(gm, node, env)
                self._check(node, env[node])
            elif node.op == "output":
                out = node.args[0]
                return [self._arg(a, env) for a in (out if isinstance(out, (list, tuple)) else [out])]
        return []

    def _check(self, node: torch.fx.Node, iv: Any) -> None:
        val = node.meta.get("val")
        if self.first is None and isinstance(iv, tuple) and isinstance(val, torch.Tensor) \
                and val.dtype == torch.int64 and (iv[0] < INT32_MIN or iv[1] > INT32_MAX):
            self.first = (node, f"{node.target} may give int64 values in [{iv[0]}, {iv[1]}]")

    def _arg(self, a: Any, env: dict) -> Any:
        if isinstance(a, torch.fx.Node):
            return env.get(a, _default(a.meta.get("val")))
        if isinstance(a, bool):
            return (int(a), int(a))
        if isinstance(a, int):
            return (a, a)
        if isinstance(a, (list, tuple)):
            return [self._arg(x, env) for x in a]
        return None

    # ------------------------------------------------------------ nodes

    def node(self, gm: torch.fx.GraphModule, node: torch.fx.Node, env: dict) -> Any:
        args = [self._arg(a, env) for a in node.args]
        target = node.target
        if target is operator.getitem:
            seq = args[0]
            return seq[node.args[1]] if isinstance(seq, list) and node.args[1] < len(seq) else _default(_val(node))
        if target is torch.ops.higher_order.cond:
            true_gm, false_gm = getattr(gm, node.args[1].target), getattr(gm, node.args[2].target)
            outs = [self.graph(g, list(args[3])) for g in (true_gm, false_gm)]
            return [_hull(a, b) if a is not None or b is not None else None for a, b in zip(*outs)]
        if target is torch.ops.higher_order.while_loop:
            return self._loop(gm, node, args)
        rule = _RULES.get(target)
        val = _val(node)
        if isinstance(val, (list, tuple)):  # several outputs (sort, max.dim, topk, split)
            out = rule(node, args) if rule is not None else None
            return out if isinstance(out, list) else [_default(v, unknown=True) for v in val]
        if _int_dtype(val) is None and not isinstance(val, (int, torch.SymInt)):
            return None
        if rule is None:
            return _default(val, unknown=True)
        try:
            iv = rule(node, args)
        except (TypeError, IndexError):  # an argument form the rule does not know: no bound
            iv = None
        return _clip(iv if iv is not None else _default(val, unknown=True), val)

    def _loop(self, gm: torch.fx.GraphModule, node: torch.fx.Node, args: list) -> Any:
        body = getattr(gm, node.args[1].target)
        carry, extra = list(args[2]), list(args[3])
        bound = static_trip_bound(node, gm)
        trips = bound if bound is not None and bound <= 4096 else 16
        first = self.first
        for _ in range(trips):
            nxt = [_hull(a, b) if a is not None or b is not None else None
                   for a, b in zip(carry, self.graph(body, carry + extra))]
            if nxt == carry:
                break
            carry = nxt
        else:
            if bound is None:  # still growing with no trip bound: unbounded from here on
                carry = [_FULL if iv is not None and iv != _OF_DTYPE.get(_int_dtype(_val(a)), None) else iv
                         for iv, a in zip(carry, node.args[2])]
        self.first = first
        self.graph(body, carry + extra)  # report a value inside the body with the settled carry
        return carry


def _default(val: Any, unknown: bool = False) -> Any:
    """What an integer value of this type may be when nothing more is known."""
    if isinstance(val, (list, tuple)):
        return [_default(v, unknown) for v in val]
    if isinstance(val, (int, torch.SymInt)) and not isinstance(val, bool):
        return (val, val) if isinstance(val, int) else _SIZE
    dt = _int_dtype(val)
    return _OF_DTYPE.get(dt, _FULL) if dt is not None else None


def _clip(iv: Interval, val: Any) -> Interval:
    """An interval no wider than the value's dtype allows (int32 and smaller wrap as in torch)."""
    dt = _int_dtype(val)
    if dt is None or dt == torch.int64:
        return iv
    lo, hi = _OF_DTYPE[dt]
    return iv if lo <= iv[0] and iv[1] <= hi else (lo, hi)


def _constant(t: Any) -> Any:
    if isinstance(t, torch.Tensor) and _int_dtype(t) is not None:
        return (int(t.min()), int(t.max())) if t.numel() else (0, 0)
    return None


def _ints(args: list, *positions: int) -> list[Interval]:
    return [args[i] for i in positions if i < len(args) and isinstance(args[i], tuple)]


def _operands(node: torch.fx.Node, args: list) -> tuple[Interval, Interval]:
    a, b = args[0], args[1]
    alpha = node.kwargs.get("alpha", 1)
    if not isinstance(a, tuple) or not isinstance(b, tuple):
        raise TypeError("a float operand")  # a float scalar meeting an int64 tensor: no bound kept
    return a, _mul(b, (alpha, alpha))


def _add(node, args):
    a, b = _operands(node, args)
    return (a[0] + b[0], a[1] + b[1])


def _sub(node, args):
    a, b = _operands(node, args)
    return (a[0] - b[1], a[1] - b[0])


def _remainder(node, args):
    a, b = args[0], args[1]
    m = max(abs(b[0]), abs(b[1]))
    if math.isinf(m):
        return _hull(a, (-m, m))
    lo = 0 if b[0] > 0 else -(m - 1)
    hi = 0 if b[1] < 0 else m - 1
    return (lo, hi)


def _floor_div(node, args):
    a, b = args[0], args[1]
    if b[0] <= 0 <= b[1]:
        return _hull(a, (-a[1], -a[0]))  # divisors of either sign (division by 0 is torch's error)
    quotients = [math.floor(x / y) if not (math.isinf(x) or math.isinf(y)) else math.copysign(math.inf, x * y)
                 for x in a for y in b]
    return (min(quotients), max(quotients))


def _div_mode(node, args):
    if node.kwargs.get("rounding_mode") is None:
        return None
    return _floor_div(node, args)


def _sum(node, args):
    a = args[0]
    inp, out = _val(node.args[0]), _val(node)
    return _scaled(a, _numel(inp) / max(_numel(out), 1.0))


def _cumsum(node, args):
    dim = node.args[1]
    shape = _val(node.args[0]).shape
    n = shape[dim] if isinstance(shape[dim], int) else INT32_MAX
    return _scaled(args[0], n)


def _prod(node, args):
    a = args[0]
    m = max(abs(a[0]), abs(a[1]))
    n = _numel(_val(node.args[0])) / max(_numel(_val(node)), 1.0)
    return _FULL if m > 1 and n > 1 else _hull(a, (-1, 1))


def _pow(node, args):
    a, e = args[0], args[1]
    if not isinstance(e, tuple) or e[1] > 64 or e[0] < 0:
        return None
    corners = [x ** k for x in a for k in range(int(e[0]), int(e[1]) + 1) if not math.isinf(x)]
    return _FULL if any(math.isinf(x) for x in a) else (min(corners), max(corners))


def _cast(node, args):
    src = _val(node.args[0])
    if isinstance(src, torch.Tensor) and (src.dtype.is_floating_point or src.dtype.is_complex):
        return _FULL  # a float cast to int64: its values are not tracked
    return args[0] if isinstance(args[0], tuple) else None


def _first(node, args):
    return args[0] if isinstance(args[0], tuple) else None


def _hull_all(node, args):
    flat: list[Any] = []
    for a in args:
        flat.extend(a if isinstance(a, list) else [a])
    return _hull(*[a for a in flat if isinstance(a, tuple)])


def _fill(node, args):
    # scalar_tensor(value); full(size, value), full_like(x, value)
    k = 0 if node.target is aten.scalar_tensor.default else 1
    v = node.args[k] if len(node.args) > k else node.kwargs.get("fill_value")
    if isinstance(v, torch.fx.Node):  # a symbolic int (a size): its interval, as computed
        iv = args[k] if len(args) > k else None
        return iv if isinstance(iv, tuple) else None
    return (int(v), int(v)) if isinstance(v, (int, bool)) else _SIZE if isinstance(v, torch.SymInt) else None


def _arange(node, args):
    ends = [a for a in node.args if isinstance(a, (int, torch.SymInt))]
    ivs = [(a, a) if isinstance(a, int) else _SIZE for a in ends] + [(0, 0)]
    return _hull(*ivs)


def _index(node, args):
    return _SIZE


def _max_indices(node, args):  # (values, indices)
    return [args[0], _SIZE]


_RULES: dict[Any, Callable[[torch.fx.Node, list], Any]] = {}
for _targets, _rule in [
    ((aten.add.Tensor, aten.add.Scalar), _add),
    ((aten.sub.Tensor, aten.sub.Scalar), _sub),
    ((aten.rsub.Tensor, aten.rsub.Scalar), lambda n, a: _sub(n, [a[1], a[0]])),
    ((aten.mul.Tensor, aten.mul.Scalar), lambda n, a: _mul(a[0], a[1])),
    ((aten.neg.default,), lambda n, a: (-a[0][1], -a[0][0])),
    ((aten.abs.default,), lambda n, a: (0 if a[0][0] <= 0 <= a[0][1] else min(abs(a[0][0]), abs(a[0][1])),
                                        max(abs(a[0][0]), abs(a[0][1])))),
    ((aten.remainder.Tensor, aten.remainder.Scalar, aten.fmod.Tensor, aten.fmod.Scalar), _remainder),
    ((aten.floor_divide.default,), _floor_div),
    ((aten.div.Tensor_mode, aten.div.Scalar_mode), _div_mode),
    ((aten.sum.default, aten.sum.dim_IntList), _sum),
    ((aten.cumsum.default,), _cumsum),
    ((aten.prod.default, aten.prod.dim_int), _prod),
    ((aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor), _pow),
    ((aten._to_copy.default, aten.to.dtype), _cast),
    ((aten.clone.default, aten.view.default, aten.reshape.default, aten.permute.default, aten.expand.default,
      aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default, aten.slice.Tensor,
      aten.select.int, aten.index.Tensor, aten.alias.default, aten.detach.default, aten.t.default,
      aten.transpose.int, aten.flip.default, aten.roll.default, aten.repeat.default, aten.lift_fresh_copy.default,
      aten.amax.default, aten.amin.default, aten.max.default, aten.min.default, aten.unfold.default,
      aten.as_strided.default, aten.index_select.default, aten.gather.default, aten.expand_copy.default,
      aten.view_copy.default, aten.permute_copy.default), _first),
    ((aten.cat.default, aten.stack.default, aten.where.self, aten.maximum.default, aten.minimum.default,
      aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_max.default,
      aten.index_put.default, aten.scatter.src, aten.scatter.value, aten.constant_pad_nd.default,
      aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.slice_scatter.default,
      aten.select_scatter.default), _hull_all),
    ((aten.full.default, aten.full_like.default, aten.scalar_tensor.default), _fill),
    ((aten.zeros.default, aten.zeros_like.default, aten.ones.default, aten.ones_like.default,
      aten.empty.memory_format, aten.empty_like.default), lambda n, a: (0, 1)),
    ((aten.arange.default, aten.arange.start, aten.arange.start_step), _arange),
    ((aten.argmax.default, aten.argmin.default, aten.nonzero.default, aten.searchsorted.Tensor,
      aten.bucketize.Tensor, aten.sym_size.int, aten.sym_numel.default, aten.sym_stride.int,
      aten.eq.Tensor, aten.eq.Scalar, aten.ne.Tensor, aten.ne.Scalar, aten.lt.Tensor, aten.lt.Scalar,
      aten.le.Tensor, aten.le.Scalar, aten.gt.Tensor, aten.gt.Scalar, aten.ge.Tensor, aten.ge.Scalar,
      aten.logical_and.default, aten.logical_or.default, aten.logical_not.default, aten.isnan.default),
     _index),
    ((aten.max.dim, aten.min.dim, aten.sort.default, aten.sort.stable, aten.topk.default,
      aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default,
      aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default, aten.kthvalue.default,
      aten.mode.default, aten.cummax.default, aten.cummin.default), _max_indices),
    ((operator.add,), lambda n, a: (a[0][0] + a[1][0], a[0][1] + a[1][1])),
    ((operator.sub,), lambda n, a: (a[0][0] - a[1][1], a[0][1] - a[1][0])),
    ((operator.mul,), lambda n, a: _mul(a[0], a[1])),
    ((operator.floordiv,), _floor_div),
]:
    for _t in _targets:
        _RULES[_t] = _rule


def int64_verdict(gm: torch.fx.GraphModule, inputs: list[Any]) -> Verdict:
    """Whether any int64 value of `gm` may leave int32, given its placeholders' values (an
    interval per integer tensor placeholder, or a real tensor for state whose values are known)."""
    for gmod in gm.modules():  # float64 is held exactly in the same 64-bit scope
        for node in getattr(gmod, "graph", torch.fx.Graph()).nodes:
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor) and val.dtype == torch.float64:
                return Verdict(True, node, f"float64 values ({node.target})")
    analysis = _Analysis()
    ivs = []
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, given in zip(phs, inputs + [None] * (len(phs) - len(inputs))):
        if isinstance(given, torch.Tensor):
            ivs.append(_constant(given))
        elif given is not None:
            ivs.append(given)
        else:
            dt = _int_dtype(node.meta.get("val"))
            # integer inputs arrive within int32 (the call checks int64 inputs against it)
            ivs.append(None if dt is None else _OF_DTYPE[torch.int32] if dt == torch.int64 else _OF_DTYPE[dt])
    analysis.graph(gm, ivs)
    if analysis.first is None:
        return Verdict(False)
    node, why = analysis.first
    return Verdict(True, node, why)


def int_scope(wide: bool) -> contextlib.AbstractContextManager:
    """JAX's 64-bit scope for a program whose verdict is wide (nothing otherwise)."""
    return jax.enable_x64(True) if wide else contextlib.nullcontext()


def describe_ints(verdict: Verdict) -> str:
    """One line for the report: how torch.int64 is held, and why."""
    if not verdict.wide:
        return "int64 as int32 (every int64 value is proven to fit), no float64"
    where = ""
    trace = verdict.node.meta.get("stack_trace") if verdict.node is not None else None
    if trace:
        frames = [ln.strip() for ln in trace.splitlines() if ln.strip().startswith("File ")]
        user = [f for f in frames if f"{os.sep}dycl_jax{os.sep}" not in f and f"{os.sep}torch{os.sep}" not in f]
        if user:
            where = " at " + user[-1].split('"')[1].rsplit(os.sep, 1)[-1] + ":" + user[-1].split("line ")[1].split(",")[0]
    return f"int64 and float64 exact, in JAX's 64-bit scope: {verdict.why}{where}"
