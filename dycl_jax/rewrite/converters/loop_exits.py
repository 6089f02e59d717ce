"""`break` / `continue` → flags; the rest of the iteration is guarded by them."""
from __future__ import annotations

import ast

from dycl_jax.rewrite.converters.flags import guard_rest, guarded
from dycl_jax.rewrite.converters.loop_finalize import finalize
from dycl_jax.rewrite.templates import Context, const, is_scope, locate, set_name, stmt_blocks

_LOOPS = (ast.For, ast.AsyncFor, ast.While)


def _own_jumps(block: list[ast.stmt], kind: type) -> list[tuple[ast.stmt, list[ast.stmt]]]:
    """break/continue statements that belong to the loop whose body is `block`."""
    found = []
    for s in block:
        if isinstance(s, kind):
            found.append((s, block))
        elif not is_scope(s) and not isinstance(s, _LOOPS) and not getattr(s, "_dycl_keep", False):
            for inner in stmt_blocks(s):
                found.extend(_own_jumps(inner, kind))
    return found


def _replace(jumps: list[tuple[ast.stmt, list[ast.stmt]]], flag: str) -> None:
    for s, block in jumps:
        i = next(k for k, t in enumerate(block) if t is s)
        block[i] = locate(set_name(flag, const(True)), s)


def _loops_inner_first(block: list[ast.stmt]) -> list[tuple[ast.stmt, list[ast.stmt]]]:
    found = []
    for s in block:
        if is_scope(s):
            continue
        for inner in stmt_blocks(s):
            found.extend(_loops_inner_first(inner))
        if isinstance(s, _LOOPS):
            found.append((s, block))
    return found


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    for loop, parent in _loops_inner_first(scope.body):
        continues = _own_jumps(loop.body, ast.Continue)
        if continues:
            flag = ctx.fresh("cont")
            ctx.exits[flag] = ("continue", loop)
            _replace(continues, flag)
            guard_rest(loop.body, [flag], stop_at_loops=True)
            loop.body.insert(0, locate(set_name(flag, const(False)), loop.body[0]))
        breaks = _own_jumps(loop.body, ast.Break)
        if not breaks:
            continue
        flag = ctx.fresh("brk")
        ctx.exits[flag] = ("break", loop)
        _replace(breaks, flag)
        guard_rest(loop.body, [flag], stop_at_loops=True)
        loop._dycl_exit_flags = getattr(loop, "_dycl_exit_flags", []) + [flag]  # type: ignore[attr-defined]
        i = next(k for k, t in enumerate(parent) if t is loop)
        parent.insert(i, locate(set_name(flag, const(False)), loop))
        if loop.orelse:  # `else:` runs only when the loop did not break
            parent[i + 2:i + 2] = guarded(loop.orelse, [flag])
            loop.orelse = []
    finalize(scope, ctx)
