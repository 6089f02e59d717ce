"""`a if test else b` → `_dycl_ops.ifexp(test, lambda ..: a, lambda ..: b, (..), site)`.

The branch lambdas take every name they read as a parameter: a staged branch is traced as
its own graph and must receive its tensors as operands, not through a closure.
"""
from __future__ import annotations

import ast
import builtins

from dycl_jax.analysis.scopes import free_names, function_locals
from dycl_jax.rewrite.templates import Context, lambda_, locate, op_call, tuple_of

_BUILTINS = set(dir(builtins))


def _reads(expr: ast.expr) -> set[str]:
    return free_names(ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[],
                                                    defaults=[]), body=expr))


class _Ternary(ast.NodeTransformer):
    def __init__(self, ctx: Context, local: set[str]) -> None:
        self.ctx = ctx
        self.local = local

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        self.generic_visit(node)  # inner conditional expressions first
        if getattr(node, "_dycl_static", False):
            return node
        params = sorted(n for n in _reads(node.body) | _reads(node.orelse) if n in self.local or n not in _BUILTINS)
        site = self.ctx.add_site("ifexp", node.lineno, ("_dycl_value",), ("true branch", "false branch"),
                                 ((node.body.lineno,), (node.orelse.lineno,)))
        call = op_call("ifexp", node.test, lambda_(params, node.body), lambda_(params, node.orelse),
                       tuple_of(params), site=site)
        call.args[3]._dycl_inputs = True  # type: ignore[attr-defined]
        return locate(ast.copy_location(call, node), node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        return node  # nested defs are their own scopes (converted separately)


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    transformer = _Ternary(ctx, function_locals(scope))
    scope.body = [transformer.visit(s) for s in scope.body]
