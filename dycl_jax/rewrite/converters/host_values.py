"""Host-side Python over tensor values → operators that stay tensors when staged:
`np.argmax(tensors)` and friends (numpy reductions), `np.argmax([c.item() for c in cs])`, and
`items[i]` (a Python list indexed by what may be a tensor, e.g. the result of such a reduction)."""
from __future__ import annotations

import ast
import types

from dycl_jax.analysis.dynamism import is_static
from dycl_jax.analysis.scopes import function_locals
from dycl_jax.rewrite.templates import Context, locate, op_call

NUMPY_REDUCTIONS = {"argmax", "argmin", "max", "amax", "min", "amin", "sum", "mean"}
# Reductions whose result is the same whether the elements are Python floats read with `.item()`
# or the one-element tensors themselves: an index (first on ties; float32 -> float64 keeps the
# order). max/sum/mean would change the result's type or precision, so their `.item()` stays.
_INDEX_REDUCTIONS = {"argmax", "argmin"}


def _is_numpy(value: object) -> bool:
    return isinstance(value, types.ModuleType) and value.__name__ == "numpy"


class _HostValues(ast.NodeTransformer):
    def __init__(self, globals_: dict, local: set[str]) -> None:
        self.globals = globals_
        self.local = local

    def _numpy_reduction(self, f: ast.expr) -> bool:
        """`np.argmax` (np the numpy module) or `argmax` imported from numpy, not shadowed."""
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.attr in NUMPY_REDUCTIONS:
            return f.value.id not in self.local and _is_numpy(self.globals.get(f.value.id))
        if isinstance(f, ast.Name) and f.id not in self.local:
            value = self.globals.get(f.id)
            return getattr(value, "__name__", None) in NUMPY_REDUCTIONS \
                and (getattr(value, "__module__", None) or "").split(".")[0] == "numpy"
        return False

    def _reduction_name(self, f: ast.expr) -> str:
        return f.attr if isinstance(f, ast.Attribute) else getattr(self.globals.get(f.id), "__name__", "")

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if len(node.args) == 1 and not node.keywords and not isinstance(node.args[0], ast.Starred) \
                and self._numpy_reduction(node.func):
            arg = node.args[0]
            if self._reduction_name(node.func) in _INDEX_REDUCTIONS:
                arg = _items_as_operands(arg)
            return locate(ast.copy_location(op_call("np_reduce", node.func, arg), node), node)
        return node

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        self.generic_visit(node)
        # constants and slices index by Python values, shapes are Python tuples: only a
        # computed index into another container may be a tensor
        if isinstance(node.ctx, ast.Load) and not isinstance(node.slice, (ast.Slice, ast.Tuple)) \
                and not is_static(node.slice, self.local) and not is_static(node.value, self.local):
            return locate(ast.copy_location(op_call("getitem", node.value, node.slice), node), node)
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        return node  # nested defs are converted as their own scopes


def _items_listed(arg: ast.expr) -> bool:
    """`[e.item() for ...]`."""
    elt = arg.elt if isinstance(arg, ast.ListComp) else None
    return isinstance(elt, ast.Call) and isinstance(elt.func, ast.Attribute) and elt.func.attr == "item" \
        and not elt.args and not elt.keywords


def may_apply(names: set[str]) -> bool:
    """A cheap test on the code's names (api._plan): it may hold `np.argmax([c.item() ...])`."""
    return "item" in names and bool(names & _INDEX_REDUCTIONS)


def applies(tree: ast.AST) -> bool:
    """The function reduces `.item()` values with an index reduction: a method without any
    branch still needs the rewrite, or torch.export guards on the Python floats."""
    # by the written name (`np.argmax`, or `argmax` imported by that name): the converter then
    # checks that it is numpy's
    return any(isinstance(n, ast.Call) and len(n.args) == 1 and _items_listed(n.args[0])
               and _written_name(n.func) in _INDEX_REDUCTIONS for n in ast.walk(tree))


def _written_name(f: ast.expr) -> str | None:
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def _items_as_operands(arg: ast.expr) -> ast.expr:
    """`[e.item() for c in cs]` -> `[item_operand(e) for c in cs]`: staged, the element stays a
    one-element tensor (its `.item()` would be a data-dependent Python float); eager, it is `.item()`."""
    if not _items_listed(arg):
        return arg
    elt = arg.elt
    operand = locate(ast.copy_location(op_call("item_operand", elt.func.value), elt), elt)
    return ast.copy_location(ast.ListComp(elt=operand, generators=arg.generators), arg)


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    transformer = _HostValues(ctx.src.fn.__globals__, function_locals(scope))
    scope.body = [transformer.visit(s) for s in scope.body]
