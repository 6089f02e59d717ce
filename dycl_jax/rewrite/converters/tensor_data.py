"""`x.data` → `_dycl_ops.data(x)`: torch.export cannot trace `Tensor.data` (it leaves a fake
tensor among the program's constants), while `x.detach()` is the same value, traceable."""
from __future__ import annotations

import ast

from dycl_jax.rewrite.templates import Context, locate, op_call


class _Data(ast.NodeTransformer):
    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if node.attr == "data" and isinstance(node.ctx, ast.Load):
            return locate(ast.copy_location(op_call("data", node.value), node), node)
        return node


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    if scope is not ctx.src.tree:
        return  # one pass covers nested defs too
    transformer = _Data()
    scope.body = [transformer.visit(s) for s in scope.body]
