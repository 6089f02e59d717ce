"""Calls of rewritten helper functions by name go to the rewritten version."""
from __future__ import annotations

import ast

from dycl_jax.analysis.scopes import function_locals
from dycl_jax.rewrite.templates import HELPER_PREFIX, Context


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    if not ctx.helpers or scope is not ctx.src.tree:
        return  # one pass over the whole function (nested defs included) is enough
    local = function_locals(scope)
    for node in ast.walk(scope):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in ctx.helpers \
                and node.id not in local:
            node.id = HELPER_PREFIX + node.id
