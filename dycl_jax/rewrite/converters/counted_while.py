"""`i = 0; while i < len(xs): ...; i += 1` → `for c in range(i, len(xs)): i = c; ...; i = c + 1`.

A counted `while` over a ModuleList with a data-dependent `break` cannot be one `while_loop`:
the counter becomes a tensor once the `break` decides it, and a module cannot be picked by a
tensor. As a `for` over a static range the counter stays a Python int on every iteration
(the break becomes a flag guarding the rest, as for any static `for`), so the loop unrolls
into one staged program. The rewrite is exact: on a `break` at count k, `i` is k (set at the
top of the iteration, the increment skipped); on normal exit it is the bound; a loop that
never runs leaves `i` unchanged.

It applies only where that equivalence is evident from the source: `i` starts from an int
literal in the same block, the test is `i < B` / `i <= B` (or mirrored) with `B` an int
literal or `len(...)` of a name/attribute the loop neither rebinds nor resizes, the body ends
with `i += 1` and writes `i` nowhere else, and no `continue` of this loop skips the increment.
"""
from __future__ import annotations

import ast

from dycl_jax.analysis.scopes import block_access
from dycl_jax.rewrite.templates import Context, is_scope, locate, stmt_blocks

_RESIZING = {"append", "extend", "insert", "pop", "remove", "clear", "__delitem__", "__setitem__"}


def _counter_and_bound(test: ast.expr) -> tuple[str, ast.expr, bool] | None:
    """(counter name, bound, inclusive) of `i < B`, `i <= B`, `B > i`, `B >= i`."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if isinstance(left, ast.Name) and isinstance(op, (ast.Lt, ast.LtE)):
        return left.id, right, isinstance(op, ast.LtE)
    if isinstance(right, ast.Name) and isinstance(op, (ast.Gt, ast.GtE)):
        return right.id, left, isinstance(op, ast.GtE)
    return None


def _chain(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) or (isinstance(node, ast.Attribute) and _chain(node.value))


def _root(node: ast.expr) -> str:
    return node.id if isinstance(node, ast.Name) else _root(node.value)  # type: ignore[attr-defined]


def _static_bound(bound: ast.expr, body: list[ast.stmt]) -> bool:
    """An int literal, or len() of a name/attribute chain the body neither rebinds nor resizes."""
    if isinstance(bound, ast.Constant):
        return type(bound.value) is int
    if not (isinstance(bound, ast.Call) and isinstance(bound.func, ast.Name) and bound.func.id == "len"
            and len(bound.args) == 1 and not bound.keywords and _chain(bound.args[0])):
        return False
    seq = ast.dump(bound.args[0])
    root = _root(bound.args[0])
    for s in body:
        for node in ast.walk(s):
            if isinstance(node, ast.Name) and node.id == root and isinstance(node.ctx, (ast.Store, ast.Del)):
                return False
            if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                    and ast.dump(node.value) == seq:
                return False
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and ast.dump(node) == seq:
                return False
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in _RESIZING and ast.dump(node.func.value) == seq:
                return False
    return True


def _is_increment(s: ast.stmt, counter: str) -> bool:
    return (isinstance(s, ast.AugAssign) and isinstance(s.target, ast.Name) and s.target.id == counter
            and isinstance(s.op, ast.Add) and isinstance(s.value, ast.Constant) and type(s.value.value) is int
            and s.value.value == 1)


def _has_own_continue(block: list[ast.stmt]) -> bool:
    for s in block:
        if isinstance(s, ast.Continue):
            return True
        if is_scope(s) or isinstance(s, (ast.For, ast.AsyncFor, ast.While)):
            continue
        if any(_has_own_continue(inner) for inner in stmt_blocks(s)):
            return True
    return False


def _starts_from_literal(block: list[ast.stmt], loop_index: int, counter: str) -> bool:
    """The last statement before the loop that writes `counter` is `counter = <int literal>`."""
    for s in reversed(block[:loop_index]):
        if counter not in block_access([s]).writes:
            continue
        return (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)
                and isinstance(s.value, ast.Constant) and type(s.value.value) is int)
    return False


def _rewrite(loop: ast.While, counter: str, bound: ast.expr, inclusive: bool, ctx: Context) -> ast.For:
    c = ctx.fresh("count")
    stop = ast.BinOp(left=bound, op=ast.Add(), right=ast.Constant(1)) if inclusive else bound
    head = ast.Assign(targets=[ast.Name(id=counter, ctx=ast.Store())], value=ast.Name(id=c, ctx=ast.Load()))
    step = ast.Assign(targets=[ast.Name(id=counter, ctx=ast.Store())],
                      value=ast.BinOp(left=ast.Name(id=c, ctx=ast.Load()), op=ast.Add(), right=ast.Constant(1)))
    rng = ast.Call(func=ast.Name(id="range", ctx=ast.Load()), args=[ast.Name(id=counter, ctx=ast.Load()), stop],
                   keywords=[])
    new = ast.For(target=ast.Name(id=c, ctx=ast.Store()), iter=rng,
                  body=[locate(head, loop), *loop.body[:-1], locate(step, loop.body[-1])], orelse=[])
    return locate(ast.copy_location(new, loop), loop)


def _convert_block(block: list[ast.stmt], ctx: Context) -> None:
    for i, s in enumerate(block):
        if is_scope(s):
            continue
        for inner in stmt_blocks(s):
            _convert_block(inner, ctx)
        if not isinstance(s, ast.While) or s.orelse or not s.body:
            continue
        found = _counter_and_bound(s.test)
        if found is None:
            continue
        counter, bound, inclusive = found
        if not (_is_increment(s.body[-1], counter) and counter not in block_access(s.body[:-1]).writes
                and _static_bound(bound, s.body) and not _has_own_continue(s.body)
                and _starts_from_literal(block, i, counter)):
            continue
        block[i] = _rewrite(s, counter, bound, inclusive, ctx)


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    _convert_block(scope.body, ctx)
