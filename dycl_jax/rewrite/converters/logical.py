"""`and` / `or` / `not` → operators: Python short-circuit for Python values; for tensors, logical
ops where only the truth value counts (tests) and operand selection elsewhere (`v = a or b`
returns `a` or `b`, as Python does)."""
from __future__ import annotations

import ast

from dycl_jax.rewrite.templates import Context, lambda_, locate, op_call


def truth(e: ast.expr) -> ast.expr:
    """Mark `e` as a test whose value is only used for its truth (and the `and`/`or` inside it,
    through `not` and nesting); returns `e`."""
    if isinstance(e, ast.BoolOp):
        e._dycl_truth = True  # type: ignore[attr-defined]
        for v in e.values:
            truth(v)
    elif isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
        truth(e.operand)
    return e


def _mark_tests(root: ast.AST) -> None:
    """Mark the `and`/`or` nodes whose value is only tested for truth (tests of if / while /
    ternaries / assert)."""
    mark = truth
    for node in ast.walk(root):
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            mark(node.test)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            mark(node.operand)  # `not v` is a truth value whatever v is
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "ifexp"
              and node.args):  # a ternary the ternary converter already turned into an operator
            mark(node.args[0])
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "unless"
              and len(node.args) == 2 and isinstance(node.args[1], ast.Lambda)):
            mark(node.args[1].body)  # an `if` test that took exit flags in (converters/flags.py)


class _Logical(ast.NodeTransformer):
    def _skip(self, node: ast.AST) -> bool:
        return any(isinstance(n, (ast.NamedExpr, ast.Yield, ast.YieldFrom, ast.Await)) for n in ast.walk(node))

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        self.generic_visit(node)
        if self._skip(node):
            return node
        op = "and_" if isinstance(node.op, ast.And) else "or_"
        if not getattr(node, "_dycl_truth", False):
            op += "value"  # the result is used as a value: it must be one of the operands
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
    _mark_tests(scope)
    transformer = _Logical()
    scope.body = [transformer.visit(s) for s in scope.body]
