"""Early `return` (inside if / loops) → one exit: a return flag and a return-value variable."""
from __future__ import annotations

import ast

from dycl_jax.analysis.dynamism import _tail_returns_only
from dycl_jax.rewrite.converters.flags import guard_rest, loops_containing
from dycl_jax.rewrite.converters.loop_finalize import finalize
from dycl_jax.rewrite.sites import RETFLAG, RETVAL
from dycl_jax.rewrite.templates import Context, const, is_scope, locate, name, op_call, set_name, stmt_blocks


def _always_exits(block: list[ast.stmt]) -> bool:
    if not block:
        return False
    last = block[-1]
    if isinstance(last, (ast.Return, ast.Raise)):
        return True
    if isinstance(last, ast.If):
        return _always_exits(last.body) and _always_exits(last.orelse)
    if isinstance(last, (ast.With, ast.AsyncWith)):
        return _always_exits(last.body)
    return False


def _replace_returns(block: list[ast.stmt]) -> None:
    for i in range(len(block) - 1, -1, -1):
        s = block[i]
        if isinstance(s, ast.Return):
            value = s.value if s.value is not None else const(None)
            # the flag last: nothing after it in the block needs a guard
            block[i:i + 1] = locate([set_name(RETVAL, value), set_name(RETFLAG, const(True))], s)
        elif not is_scope(s):
            for inner in stmt_blocks(s):
                _replace_returns(inner)


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    if _tail_returns_only(scope.body):
        return
    body = scope.body
    if not _always_exits(body):
        body.append(locate(ast.Return(value=const(None)), body[-1]))
    _replace_returns(body)
    ctx.exits[RETFLAG] = ("return", None)
    guard_rest(body, [RETFLAG])
    for loop in loops_containing(body, RETFLAG):
        loop._dycl_exit_flags = getattr(loop, "_dycl_exit_flags", []) + [RETFLAG]  # type: ignore[attr-defined]
    finalize(scope, ctx)
    first = body[0]
    init = [set_name(RETFLAG, const(False)), set_name(RETVAL, op_call("Undefined", const(RETVAL)))]
    body[0:0] = locate(init, first)
    body.append(locate(ast.Return(value=name(RETVAL)), body[-1]))
