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
from dycl_jax.rewrite.templates import Context, is_scope, locate, stmt_blocks


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
    arms = []
    for chosen in (choice.body, choice.orelse):  # each arm: the statement copied with that object in place
        holder.value = chosen  # type: ignore[attr-defined]
        arms.append(_split(copy.deepcopy(stmt), updated))  # `(a if s else b if t else c).append(x)` too
    holder.value = choice  # type: ignore[attr-defined]
    return locate(ast.copy_location(ast.If(test=choice.test, body=[arms[0]], orelse=[arms[1]]), stmt), stmt)


def _split_block(block: list[ast.stmt], updated: set[str]) -> None:
    block[:] = [_split(s, updated) for s in block]
    for s in block:
        if not is_scope(s):  # nested defs are their own scopes (converted separately)
            for inner in stmt_blocks(s):
                _split_block(inner, updated)


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    _split_block(scope.body, block_access(scope.body).mutates)
