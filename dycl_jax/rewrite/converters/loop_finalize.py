"""Loops with exit flags (used by the return and break/continue converters): a `while` tests
the flags; an unrolled `for` guards each iteration (its target included) and stops the
Python loop once a flag is a Python True."""
from __future__ import annotations

import ast

from dycl_jax.rewrite.converters.flags import guarded, not_any
from dycl_jax.rewrite.templates import Context, is_scope, locate, name, op_call, stmt_blocks


def _loops(block: list[ast.stmt]):
    for s in block:
        if is_scope(s):
            continue
        for inner in stmt_blocks(s):
            yield from _loops(inner)
        if isinstance(s, (ast.For, ast.AsyncFor, ast.While)) and getattr(s, "_dycl_exit_flags", None):
            yield s


def finalize(scope: ast.FunctionDef, ctx: Context) -> None:
    """Make every loop stop on its exit flags; flags added by a later converter are added on.

    Guarding an outer loop's body gives a loop nested in it the outer flags too (an outer
    `break` must also stop the inner loop's later iterations, see flags.guarded), after the
    inner loop was finalized in the same pass (inner loops come first): repeat until no loop
    has a flag it does not stop on."""
    while any([_finalize(loop, ctx) for loop in list(_loops(scope.body))]):
        pass


def _finalize(loop: ast.stmt, ctx: Context) -> bool:
    """Make one loop stop on the exit flags it does not stop on yet; whether it had any."""
    done = getattr(loop, "_dycl_done_flags", [])
    flags = [f for f in dict.fromkeys(loop._dycl_exit_flags) if f not in done]
    if not flags:
        return False
    loop._dycl_done_flags = done + flags  # type: ignore[attr-defined]
    if isinstance(loop, ast.While):
        tests = not_any(flags)
        values = tests.values if isinstance(tests, ast.BoolOp) else [tests]
        loop.test = locate(ast.BoolOp(op=ast.And(), values=[*values, loop.test]), loop.test)
        loop._dycl_static = False  # type: ignore[attr-defined]
    elif not done:
        item = ctx.fresh("it")
        bind = locate(ast.Assign(targets=[loop.target], value=name(item)), loop)
        loop.target = locate(name(item, store=True), loop)
        stop = locate(ast.If(test=op_call("stop", *[name(f) for f in flags]), body=[ast.Break()], orelse=[]),
                      loop)
        stop._dycl_keep = True  # type: ignore[attr-defined]
        loop.body = [*guarded([bind, *loop.body], flags), stop]
    else:  # already unrolled with a stop check: guard once more, stop on the new flags too
        stop = loop.body[-1]
        stop.test.args.extend(locate(name(f), loop) for f in flags)
        loop.body = [*guarded(loop.body[:-1], flags), stop]
    return True
