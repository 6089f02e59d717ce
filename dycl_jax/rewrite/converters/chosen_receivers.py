"""`(done if t else beams).append(c)` → `if t: done.append(c) else: beams.append(c)`.

A conditional expression that chooses the object a method is called on (or an item is stored
into, `(pos if t else neg)[k] = v`) decides which object the statement changes. As a value it
would be one output of a converted construct, a new object on the staged host, so the
statement would change that copy; as a statement per branch, each branch changes its own
object, and the `if` is converted like any other (the structure check or the dispatch host's
decision then applies). Likewise `target = done if t else beams` where the scope updates some
object in place: as an `if`, the construct knows a path makes `target` that object
(`Site.made_aliases`).
"""
from __future__ import annotations

import ast
import copy

from dycl_jax.analysis.scopes import block_access
from dycl_jax.rewrite.converters.branches import object_of as _object_of
from dycl_jax.rewrite.templates import Context, locate


def _holder(stmt: ast.stmt, updated: set[str]) -> ast.AST | None:
    """The node whose `.value` / `.func.value` is the conditional expression choosing the object
    `stmt` changes: a call on it (the whole expression statement, or the whole value of an
    assignment, `y = (a if t else b).pop()`), an item or attribute stored into it, or the value
    of `n = a if t else b` where `a` or `b` is an existing object and `updated` (the names the
    scope updates in place) holds n or it."""
    value = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign, ast.AugAssign)) else None
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and isinstance(value.func.value, ast.IfExp) and not isinstance(stmt, ast.AugAssign):
        return value.func
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AugAssign) else []
    if len(targets) == 1 and isinstance(targets[0], (ast.Subscript, ast.Attribute)) \
            and isinstance(targets[0].value, ast.IfExp):
        return targets[0]
    if isinstance(stmt, ast.Assign) and len(targets) == 1 and isinstance(targets[0], ast.Name) \
            and isinstance(value, ast.IfExp):
        held = {_object_of(value.body), _object_of(value.orelse)} - {None}
        if held and (held | {targets[0].id}) & updated:
            return stmt
    return None


def _split(stmt: ast.stmt, updated: set[str]) -> ast.stmt:
    holder = _holder(stmt, updated)
    if holder is None:
        return stmt
    choice = holder.value  # type: ignore[attr-defined]
    path = _path(stmt, holder)
    arms = []
    for chosen in (choice.body, choice.orelse):
        arm = copy.deepcopy(stmt)
        _follow(arm, path).value = copy.deepcopy(chosen)
        arms.append(_split(arm, updated))  # `(a if s else b if t else c).append(x)`: the inner choice too
    return locate(ast.copy_location(ast.If(test=choice.test, body=[arms[0]], orelse=[arms[1]]), stmt), stmt)


def _path(root: ast.AST, target: ast.AST) -> list[tuple[str, int | None]]:
    """The fields (and list indices) leading from `root` to `target`."""
    if root is target:
        return []
    for field, value in ast.iter_fields(root):
        for i, child in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(child, ast.AST):
                sub = _path(child, target)
                if sub is not None:
                    return [(field, i if isinstance(value, list) else None), *sub]
    return None  # type: ignore[return-value]


def _follow(root: ast.AST, path: list[tuple[str, int | None]]) -> ast.AST:
    for field, i in path:
        root = getattr(root, field) if i is None else getattr(root, field)[i]
    return root


class _Receivers(ast.NodeTransformer):
    def __init__(self, updated: set[str]) -> None:
        self.updated = updated

    def generic_visit(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                setattr(node, field, [_split(s, self.updated) for s in stmts])
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        return node  # nested defs are their own scopes (converted separately)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]
    visit_Lambda = visit_FunctionDef  # type: ignore[assignment]


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    updated = block_access(scope.body).mutates
    transformer = _Receivers(updated)
    scope.body = [_split(transformer.visit(s), updated) for s in scope.body]
