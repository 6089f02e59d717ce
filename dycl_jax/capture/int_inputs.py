"""Python ints a region receives, exported as symbolic ints rather than baked-in constants.

torch.export traces them as SymInts. Afterwards the graph says which of them it needs as
values: those a tensor's shape depends on, those torch specialised (a `dim=` argument, a
list index) and those behind a result the host cannot recompute must stay static (the
region is captured again with them as constants). Every other one is a graph input, and the
captured program holds for every value that satisfies its guards (a Python `if t > 3:` in
the region, an index's bounds), which the host checks before reusing it.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import sympy
import torch
from torch.export import Dim, ExportedProgram
from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.printers import PythonPrinter

from dycl_jax.lower.dtypes import INT32_MAX

_NAMESPACE = {**SYMPY_INTERP, "math": math, "inf": float("inf")}


def candidates(leaves: Sequence[Any]) -> tuple[int, ...]:
    """Leaves that may become symbolic: plain ints that fit int32 (torch.export assumes a
    symbolic int is non-negative; a negative one stays a constant)."""
    return tuple(i for i, v in enumerate(leaves) if type(v) is int and 0 <= v <= INT32_MAX)


def export_spec(inputs: Sequence[int], dynamic: frozenset[int]) -> tuple:
    """torch.export's `dynamic_shapes` for the wrapper's `*inputs`: static tensors, symbolic ints."""
    return (tuple(Dim.AUTO if i in dynamic else None for i in inputs),)


def symbol_of(v: Any) -> sympy.Symbol | None:
    """The symbol a symbolic int input stands for (None once torch specialised it to a number)."""
    expr = v.node.expr if isinstance(v, torch.SymInt) else None
    return expr if isinstance(expr, sympy.Symbol) else None


@dataclass
class IntResult:
    """An output leaf that is a Python int or bool computed from symbolic inputs only: the
    host evaluates it from the call's ints (`fn(*values of leaves)`)."""

    position: int
    leaves: tuple[int, ...]
    fn: Callable[..., Any]
    kind: type


@dataclass
class SymbolicInts:
    """What an export with symbolic int inputs gave: the leaves that are graph inputs, those
    that must be static after all, and the check that the graph holds for a call's values."""

    leaves: tuple[int, ...]  # leaf index per symbolic input that stayed a symbol
    static: frozenset[int]  # leaves the graph needs as values: capture again with them constant
    specialised: frozenset[int] = frozenset()  # of those, the ones torch fixed to this call's value
    guard: Callable[[Sequence[Any]], bool] | None = None  # leaves -> whether the graph holds
    results: list[IntResult] = field(default_factory=list)


def _lambda(args: list[str], body: str) -> Callable:
    fn = eval(f"lambda {', '.join(args)}: {body}", dict(_NAMESPACE))  # noqa: S307 (our own printed sympy)
    fn.printed = (tuple(args), body)  # the text, for an exported host to evaluate without torch
    return fn


def int_result(position: int, value: torch.SymInt | torch.SymBool, symbols: dict[sympy.Symbol, int]) -> IntResult:
    """How the host computes a symbolic output from the int inputs (`symbols`: their leaves)."""
    expr = value.node.expr
    names = sorted(expr.free_symbols, key=str)
    fn = _lambda([str(s) for s in names], PythonPrinter().doprint(expr))
    return IntResult(position, tuple(symbols[s] for s in names), fn, bool if isinstance(value, torch.SymBool) else int)


def _shape_symbols(ep: ExportedProgram) -> set[sympy.Symbol]:
    """Symbols some tensor's size depends on, in any graph of the program (not its strides or
    storage offset: `x[:, t]` is a view at offset `t`, while the lowering is functional)."""
    found: set[sympy.Symbol] = set()
    for gm in ep.graph_module.modules():
        for node in getattr(gm, "graph", torch.fx.Graph()).nodes:
            val = node.meta.get("val")
            for t in val if isinstance(val, (list, tuple)) else [val]:
                if isinstance(t, torch.Tensor):
                    for d in t.shape:
                        if isinstance(d, torch.SymInt):
                            found |= d.node.expr.free_symbols
    return found


def analyse(ep: ExportedProgram, inputs: Sequence[int], dynamic: frozenset[int], unresolved: set[sympy.Symbol],
            results: list[IntResult]) -> SymbolicInts:
    """Classify the symbolic int inputs of an exported region (`inputs`: the leaf index of each
    user input of the graph, in order; `unresolved`: symbols behind outputs the host cannot
    recompute). With any of them static, the caller exports again and this graph is dropped."""
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    placeholders = placeholders[len(placeholders) - len(inputs):]  # the user inputs come last
    symbols: dict[sympy.Symbol, int] = {}
    static: set[int] = set()
    specialised: set[int] = set()
    slot: dict[int, int] = {}  # user input position -> leaf, for the symbolic ones
    for k, (leaf, node) in enumerate(zip(inputs, placeholders)):
        if leaf in dynamic:
            sym = symbol_of(node.meta.get("val"))
            if sym is None:  # specialised by torch: a dim, a list index, `range(t)`, or an index into one place
                static.add(leaf)
                specialised.add(leaf)
            else:
                symbols[sym], slot[k] = leaf, leaf
    shaped = _shape_symbols(ep) | unresolved
    static |= {leaf for sym, leaf in symbols.items() if sym in shaped}
    if static:
        return SymbolicInts(tuple(symbols.values()), frozenset(static), frozenset(specialised))
    body = []
    for g in getattr(ep, "_guards_code", []):  # the guards torch's own ExportedProgram.module() checks
        for k, leaf in slot.items():
            g = g.replace(f"L['inputs'][{k}]", f"v[{leaf}]")
        if "L[" in g:  # a guard on something other than these ints: it cannot be checked per call
            return SymbolicInts(tuple(symbols.values()), frozenset(symbols.values()))
        body.append(f"({g})")
    for sym, leaf in symbols.items():
        vr = ep.range_constraints.get(sym)
        if vr is not None and vr.lower != -int_oo:
            body.append(f"({int(vr.lower)} <= v[{leaf}])")
        if vr is not None and vr.upper != int_oo:
            body.append(f"(v[{leaf}] <= {int(vr.upper)})")
    return SymbolicInts(tuple(symbols.values()), frozenset(),
                        guard=_lambda(["v"], " and ".join(body)) if body else None, results=results)


_BASIC = (int, torch.SymInt, slice, type(None), type(Ellipsis))
_SETITEM = torch.Tensor.__setitem__


def _setitem(self: torch.Tensor, index: Any, value: Any) -> None:
    # torch's own `x[:n, t] = v` specialises a symbolic `t`; as the update of the view `x[:n, t]`
    # it stays a symbol (select + copy), with the same result
    parts = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, torch.SymInt) for i in parts) and all(isinstance(i, _BASIC) for i in parts):
        view = self[index]
        if isinstance(value, torch.Tensor):
            view.copy_(value)
        else:
            view.fill_(value)
        return
    _SETITEM(self, index, value)


@contextlib.contextmanager
def symbolic_setitem() -> Iterator[None]:
    """Basic-index assignment with symbolic ints as a view update, while a region is exported."""
    torch.Tensor.__setitem__ = _setitem
    try:
        yield
    finally:
        torch.Tensor.__setitem__ = _SETITEM
