"""Runs the if/elif and while converters inside-out (inner constructs first), so each one
is analysed with its inner constructs already turned into operator calls."""
from __future__ import annotations

import ast

from dycl_jax.rewrite.converters.conditionals import convert_if, is_chain_member
from dycl_jax.rewrite.converters.while_loops import convert_while
from dycl_jax.rewrite.templates import Context, is_scope, stmt_blocks


def _post_order(block: list[ast.stmt], parent: ast.AST | None, out: list) -> None:
    for s in block:
        if is_scope(s):
            continue
        for inner in stmt_blocks(s):
            _post_order(inner, s, out)
        if isinstance(s, (ast.If, ast.While)):
            out.append((s, block, parent))


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    order: list = []
    _post_order(scope.body, scope, order)
    for node, block, parent in order:
        if isinstance(node, ast.If):
            if not is_chain_member(node, parent):
                convert_if(node, block, scope, ctx)
        else:
            convert_while(node, block, scope, ctx)
