"""`super()` → `super(__class__, self)`: zero-argument super() does not work inside the
generated branch functions, the explicit form does (the `__class__` cell is kept)."""
from __future__ import annotations

import ast

from dycl_jax.rewrite.templates import Context, locate, name


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    if scope is not ctx.src.tree or ctx.src.class_name is None:
        return
    params = scope.args.posonlyargs + scope.args.args
    if not params:
        return
    first = params[0].arg
    for node in ast.walk(scope):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super" \
                and not node.args and not node.keywords:
            node.args = [locate(name("__class__"), node), locate(name(first), node)]
