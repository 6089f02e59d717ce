"""Host-side Python over tensor values → operators that stay tensors when staged:
`np.argmax(tensors)` and friends (numpy reductions), and `items[i]` (a Python list indexed
by what may be a tensor, e.g. the result of such a reduction)."""
from __future__ import annotations

import ast
import types

from dycl_jax.analysis.dynamism import is_static
from dycl_jax.analysis.scopes import function_locals
from dycl_jax.rewrite.templates import Context, locate, op_call

NUMPY_REDUCTIONS = {"argmax", "argmin", "max", "amax", "min", "amin", "sum", "mean"}


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

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if len(node.args) == 1 and not node.keywords and not isinstance(node.args[0], ast.Starred) \
                and self._numpy_reduction(node.func):
            return locate(ast.copy_location(op_call("np_reduce", node.func, node.args[0]), node), node)
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


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    transformer = _HostValues(ctx.src.fn.__globals__, function_locals(scope))
    scope.body = [transformer.visit(s) for s in scope.body]
