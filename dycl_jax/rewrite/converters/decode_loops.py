"""With `to_jax(..., max_len=N)` (or `host="auto"`'s padded attempt, N = convert.AUTO_UNROLL,
"natural": the loop must end by its own test within N): the method's decode loop, unrolled
with every exit a `return`.

    while TEST:                 _dycl_unroll = _dycl_ops.unrolled(None, N)
        BODY (… break …)   →    for _ in _dycl_unroll:
    else:                           if not TEST: ELSE; REST
        ELSE                        BODY (… REST …)
    REST                        REST (exceeded: _dycl_unroll.cut)

`REST`, the statements after the loop (ending in a `return`), is copied to every place the
loop can stop: a `break`, a false test, the end of a `for`'s items. So each exit computes what
follows the loop on that iteration's own values, with their exact shapes (a sequence grown by
`torch.cat`, a list of per-step tensors), and the loop is a Python loop over at most N
iterations, each guarded by the return flag as any loop with an early `return` (returns.py).
The iterations' results meet only in the method's return value, where the joins pad what
differs in shape (padding.py). Every `return` of the method becomes `_dycl_ops.decoded(value,
exceeded, ...)`; `exceeded` is true only where N iterations ran out before the loop's own end.

Only the first `while`, or `for` with its own `break`/`return`, at the top level of the method
is unrolled; a loop inside another statement (`if`, `with`, another loop) is not, and when no
loop qualifies, the first such nested loop gets a located error saying so. A method with no
loop at all still returns `decoded(...)`: its `if` joins pad the return value as well (an `if`
whose branches return tensors of different shapes).
"""
from __future__ import annotations

import ast
import copy
import os

from dycl_jax.errors import DyclError
from dycl_jax.rewrite.converters.jump_else import always_jumps
from dycl_jax.rewrite.templates import Context, const, is_scope, locate, name, op_call, set_name, stmt_blocks

_LOOPS = (ast.For, ast.While)


def _own(block: list[ast.stmt], kinds: tuple, into_loops: bool) -> list[tuple[ast.stmt, list[ast.stmt]]]:
    """Statements of `kinds` in the block and the blocks nested in it (same scope), with their
    containing list; loops nested in the block are entered only with into_loops."""
    found = []
    for s in block:
        if isinstance(s, kinds):
            found.append((s, block))
        if is_scope(s) or (isinstance(s, (*_LOOPS, ast.AsyncFor)) and not into_loops):
            continue
        for inner in stmt_blocks(s):
            found.extend(_own(inner, kinds, into_loops))
    return found


def _exits(loop: ast.stmt) -> bool:
    return bool(_own(loop.body, (ast.Break,), False) or _own(loop.body, (ast.Return,), True))


def _candidate(s: ast.stmt) -> bool:
    return isinstance(s, ast.While) or (isinstance(s, ast.For) and _exits(s))


def _nested_candidate(body: list[ast.stmt]) -> tuple[ast.stmt, ast.stmt] | None:
    """(loop, the statement at the top level holding it) of the first candidate nested deeper."""
    for top in body:
        if is_scope(top):
            continue
        for inner in stmt_blocks(top):
            for s, _ in _own(inner, _LOOPS, True):
                if _candidate(s):
                    return s, top
    return None


def _returns_decoded(scope: ast.FunctionDef, ctx: Context) -> None:
    """Every `return` of a method without a loop to unroll as `decoded(value, False, ...)`."""
    where = [const(ctx.unroll.max_len), const(ctx.src.file), const(scope.lineno), const(ctx.code(scope.lineno))]
    body = scope.body
    if not always_jumps(body):
        body.append(locate(ast.Return(value=None), body[-1]))
    for ret, _ in _own(body, (ast.Return,), True):
        ret.value = locate(op_call("decoded", ret.value or const(None), const(False), *where), ret)


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    if ctx.unroll is None or scope is not ctx.src.tree:
        return
    max_len = ctx.unroll.max_len
    body = scope.body
    i = next((k for k, s in enumerate(body) if _candidate(s)), None)
    if i is None:
        nested = _nested_candidate(body)
        if nested is not None:
            loop, top = nested
            raise DyclError(
                f"max_len={max_len}: the loop at line {loop.lineno} is inside the "
                f"`{type(top).__name__.lower()}` at line {top.lineno}; only a loop at the top level of "
                f"{scope.name}() is unrolled into one staged program", location=ctx.src.location(loop.lineno),
                fix="move the loop to the top level of the method, or convert with host=\"auto\" / \"dispatch\" "
                "(the dispatch host runs it exactly)")
        _returns_decoded(scope, ctx)
        return
    loop = body[i]
    where = (ctx.src.file, loop.lineno, ctx.code(loop.lineno))
    info = [const(max_len), const(where[0]), const(where[1]), const(where[2])]
    rest = body[i + 1:]
    if not always_jumps(rest):
        rest.append(locate(ast.Return(value=None), rest[-1] if rest else loop))
    for ret, _ in _own(body, (ast.Return,), True):  # every exit of the method says whether N ran out
        ret.value = locate(op_call("decoded", ret.value or const(None), const(False), *info), ret)
    unroll = ctx.fresh("unroll")

    def stop_here() -> list[ast.stmt]:
        return copy.deepcopy(rest)

    for brk, block in _own(loop.body, (ast.Break,), False):
        k = next(n for n, s in enumerate(block) if s is brk)
        block[k:k + 1] = stop_here()
    if isinstance(loop, ast.While):
        items: ast.expr = const(None)
        target: ast.expr = name(ctx.fresh("step"), store=True)
        head: list[ast.stmt] = []
        if not (isinstance(loop.test, ast.Constant) and loop.test.value):
            test = ast.UnaryOp(op=ast.Not(), operand=loop.test)
            head = [locate(ast.If(test=test, body=[*loop.orelse, *stop_here()], orelse=[]), loop)]
        after: list[ast.stmt] = []
    else:
        items, target, head, after = loop.iter, loop.target, [], list(loop.orelse)
    new_loop = locate(ast.For(target=target, iter=name(unroll), body=[*head, *loop.body], orelse=[]), loop)
    ran_out = stop_here()
    for ret, _ in _own(ran_out, (ast.Return,), True):
        ret.value.args[1] = locate(ast.Attribute(value=name(unroll), attr="cut", ctx=ast.Load()), ret)
    make = locate(set_name(unroll, op_call("unrolled", items, const(max_len), const(ctx.unroll.natural),
                                           *info[1:])), loop)
    body[i:] = [make, new_loop, *after, *ran_out]
    bound = f"to its own bound, at most {max_len} iterations" if ctx.unroll.natural else f"at most {max_len} iterations"
    ctx.unrolled.append(f"{type(loop).__name__.lower()}@{os.path.basename(where[0])}:{where[1]} ({bound})")
