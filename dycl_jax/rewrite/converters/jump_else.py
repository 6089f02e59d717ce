"""`if c: A; continue` followed by S → `if c: A` / `else: S` (likewise `break` and `return`).

After this, each path runs to the end of its block inside one construct, so one cond joins
two complete paths. Split into an `if` plus a guard on the exit flag instead, a variable
that both paths leave in the same state (e.g. a feature map that both reshape) would have to
agree between the `if` and the guard, where one path holds the old value and one the new.
"""
from __future__ import annotations

import ast

from dycl_jax.rewrite.templates import Context, is_scope, stmt_blocks

_JUMPS = (ast.Return, ast.Break, ast.Continue)


def always_jumps(block: list[ast.stmt]) -> bool:
    """Whether the block always ends in return / break / continue (through nested if/else).

    `with` and `try` are not looked into: moving statements inside them would change which
    context manager or handler covers them. `raise` is not a jump here: a branch that raises
    cannot be staged either way, and the statements after it stay where the user wrote them.
    """
    if not block:
        return False
    last = block[-1]
    if isinstance(last, _JUMPS):
        return True
    if isinstance(last, ast.If):
        return always_jumps(last.body) and always_jumps(last.orelse)
    return False


def restructure(block: list[ast.stmt]) -> None:
    """Move what follows a jumping `if` into its other branch, in this block and nested ones."""
    for i, s in enumerate(block):
        if not isinstance(s, ast.If) or i == len(block) - 1:
            continue
        body_jumps, else_jumps = always_jumps(s.body), always_jumps(s.orelse)
        if body_jumps == else_jumps:
            continue  # neither jumps (nothing to do) or both do (the rest is unreachable)
        rest = block[i + 1:]
        del block[i + 1:]
        (s.orelse if body_jumps else s.body).extend(rest)
        break
    for s in block:
        if not is_scope(s):
            for inner in stmt_blocks(s):
                restructure(inner)


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    restructure(scope.body)
