"""`and` / `or` / `not` → operators: Python short-circuit for Python values, logical ops for tensors."""
from __future__ import annotations

import ast

from dycl_jax.rewrite.templates import Context, lambda_, locate, op_call


class _Logical(ast.NodeTransformer):
    def _skip(self, node: ast.AST) -> bool:
        return any(isinstance(n, (ast.NamedExpr, ast.Yield, ast.YieldFrom, ast.Await)) for n in ast.walk(node))

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        self.generic_visit(node)
        if self._skip(node):
            return node
        op = "and_" if isinstance(node.op, ast.And) else "or_"
        result = node.values[-1]
        for value in reversed(node.values[:-1]):
            result = op_call(op, value, lambda_([], result))
        return locate(ast.copy_location(result, node), node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not) and not self._skip(node):
            return locate(ast.copy_location(op_call("not_", node.operand), node), node)
        return node

    def _static_test(self, node: ast.AST) -> ast.AST:
        # a provably static test stays plain Python, `and`/`or` included
        for field_name, value in ast.iter_fields(node):
            if field_name == "test" and (getattr(node, "_dycl_static", False) or getattr(node, "_dycl_keep", False)):
                continue
            if isinstance(value, list):
                setattr(node, field_name, [self.visit(v) if isinstance(v, ast.AST) else v for v in value])
            elif isinstance(value, ast.AST):
                setattr(node, field_name, self.visit(value))
        return node

    visit_If = visit_While = visit_IfExp = _static_test


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    if scope is not ctx.src.tree:
        return  # one pass covers nested defs too
    transformer = _Logical()
    scope.body = [transformer.visit(s) for s in scope.body]
