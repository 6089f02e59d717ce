"""Marks provably static tests, and keeps `.item()` / bool() / float() / int() in dynamic
tests as 0-d tensors so torch.export sees a tensor predicate, not an unbacked SymInt."""
from __future__ import annotations

import ast

from dycl_jax.analysis.dynamism import is_static
from dycl_jax.analysis.scopes import function_locals
from dycl_jax.rewrite.templates import Context, op_call, is_scope

_CASTS = {"bool": "as_bool", "float": "as_float", "int": "as_int"}


class _KeepTensor(ast.NodeTransformer):
    def __init__(self, local: set[str]) -> None:
        self.local = local

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "item" and not node.args and not node.keywords:
            return ast.copy_location(op_call("item", f.value), node)
        if isinstance(f, ast.Name) and f.id in _CASTS and f.id not in self.local and len(node.args) == 1 \
                and not node.keywords:
            return ast.copy_location(op_call(_CASTS[f.id], node.args[0]), node)
        return node

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        return node  # a nested scope: not part of the predicate's value


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    local = function_locals(scope)
    stack: list[ast.AST] = list(scope.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.If, ast.While, ast.IfExp)) and not hasattr(node, "_dycl_static"):
            node._dycl_static = is_static(node.test, local)  # type: ignore[attr-defined]
            if not node._dycl_static:
                node.test = _KeepTensor(local).visit(node.test)
        if not (is_scope(node) and not isinstance(node, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))
