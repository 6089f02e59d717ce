"""Variables passed to an operator before they are surely assigned start as `Undefined`."""
from __future__ import annotations

import ast

from dycl_jax.analysis.scopes import function_locals, param_names
from dycl_jax.rewrite.templates import Context, const, is_scope, locate, op_call, set_name


def _passed(scope: ast.FunctionDef) -> list[str]:
    names: list[str] = []
    stack: list[ast.AST] = list(scope.body)
    while stack:
        node = stack.pop()
        if getattr(node, "_dycl_inputs", False):
            names.extend(e.id for e in node.elts if isinstance(e, ast.Name))
        if not (is_scope(node) and not isinstance(node, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))
    return names


def _init_scope(scope: ast.FunctionDef) -> None:
    # a user function's own locals include those now only assigned inside generated branch
    # functions: a call of the branch passes them along before any path assigned them
    local = (function_locals(scope) | getattr(scope, "_dycl_user_locals", set())) - param_names(scope)
    names = sorted(set(_passed(scope)) & local)
    if names:
        init = [set_name(n, op_call("Undefined", const(n))) for n in names]
        scope.body[0:0] = locate(init, scope.body[0])


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    if scope is not ctx.src.tree:
        return  # one pass over every scope, generated ones included
    for node in ast.walk(scope):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            _init_scope(node)
