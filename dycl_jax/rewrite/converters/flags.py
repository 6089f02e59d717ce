"""Shared by the early-exit converters: flag tests and guarding the rest of a block.

Statements after a possible exit run only while no exit flag is set. Guards are kept flat
rather than nested (every level of nested torch.cond multiplies export time): a run of
statements gets one guard, an `if` without `else` and a `while` take the flag into their own
test, a `for` loop stops through its exit flags. Compound statements join the run of simple
ones: inside one guard, values the run computes stay what they are (a Python loop index
stays a Python int), where a join between two guards would turn them into tensors. Each guard
reads the flag as it is at that point, so a statement that may itself set a flag ends its guard's
run, and what follows it gets a guard of its own.
"""
from __future__ import annotations

import ast

from dycl_jax.analysis.cfg import Liveness
from dycl_jax.rewrite.sites import RETVAL
from dycl_jax.rewrite.templates import Context, is_scope, lambda_, locate, name, op_call, stmt_blocks


def sets_flag(node: ast.AST, flag: str) -> bool:
    """Whether the statement (or one nested in it, same scope) assigns the flag."""
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == flag for t in n.targets):
            return True
        if n is node or not is_scope(n):
            stack.extend(ast.iter_child_nodes(n))
    return False


def not_any(flags: list[str]) -> ast.expr:
    """`not f1 and not f2 ...`"""
    tests = [ast.UnaryOp(op=ast.Not(), operand=name(f)) for f in flags]
    return tests[0] if len(tests) == 1 else ast.BoolOp(op=ast.And(), values=tests)


def _with_flags(test: ast.expr, flags: list[str]) -> ast.expr:
    return locate(ast.BoolOp(op=ast.And(), values=[*[ast.UnaryOp(op=ast.Not(), operand=name(f)) for f in flags],
                                                   test]), test)


def _unless(test: ast.expr, flags: list[str]) -> ast.expr:
    """`_dycl_ops.unless((f1, ...), lambda: test)`: `not f1 and ... and test`, and the operator
    can tell a false result that only means "an exit flag is set" (see operators.unless)."""
    flag_tuple = ast.Tuple(elts=[name(f) for f in flags], ctx=ast.Load())
    return locate(op_call("unless", flag_tuple, lambda_([], test)), test)


def guard_if(body: list[ast.stmt], flags: list[str]) -> ast.If:
    guard = locate(ast.If(test=not_any(flags), body=body, orelse=[]), body[0])
    guard._dycl_guard = True  # type: ignore[attr-defined]
    guard._dycl_flags = set(flags)  # type: ignore[attr-defined]
    return guard


def guarded(stmts: list[ast.stmt], flags: list[str]) -> list[ast.stmt]:
    """The statements, each running only while no flag is set (flat, see module docstring)."""
    out: list[ast.stmt] = []
    group: list[ast.stmt] = []

    def flush() -> None:
        if group:
            out.append(guard_if(list(group), flags))
            group.clear()

    for s in stmts:
        covered = set(flags) <= getattr(s, "_dycl_flags", set())
        if covered or getattr(s, "_dycl_keep", False) or isinstance(s, (ast.Pass,)):
            flush()
            out.append(s)
        elif isinstance(s, (ast.If, ast.While)) and not (isinstance(s, ast.If) and s.orelse):
            flush()
            plain_if = isinstance(s, ast.If) and not getattr(s, "_dycl_guard", False)
            s.test = _unless(s.test, flags) if plain_if else _with_flags(s.test, flags)
            s._dycl_static = False  # type: ignore[attr-defined]
            s._dycl_flags = getattr(s, "_dycl_flags", set()) | set(flags)  # type: ignore[attr-defined]
            out.append(s)
        elif isinstance(s, (ast.For, ast.AsyncFor)):
            flush()
            s._dycl_exit_flags = getattr(s, "_dycl_exit_flags", []) + list(flags)  # type: ignore[attr-defined]
            out.append(s)
        else:
            group.append(s)
            if any(sets_flag(s, f) for f in flags):
                # (an `if` with an `else`/`elif` that may exit: what follows it needs the flag read
                # again, as a guard reads it only at its start)
                flush()
    flush()
    return out


def guard_rest(block: list[ast.stmt], flags: list[str], stop_at_loops: bool = False) -> None:
    """After a statement that may set a flag, run the rest of the block only if no flag is set.

    Applied to nested blocks first; with stop_at_loops, bodies of nested loops are left alone
    (their break/continue flags are their own)."""
    for s in block:
        if (stop_at_loops and isinstance(s, (ast.For, ast.AsyncFor, ast.While))) or is_scope(s):
            continue
        for inner in stmt_blocks(s):
            guard_rest(inner, flags, stop_at_loops)
    for i, s in enumerate(block):
        if i < len(block) - 1 and any(sets_flag(s, f) for f in flags):
            block[i + 1:] = guarded(block[i + 1:], flags)
            return


def loops_containing(scope_body: list[ast.stmt], flag: str) -> list[ast.stmt]:
    """Loops (same scope) whose body may set the flag."""
    found = []
    stack = list(scope_body)
    while stack:
        s = stack.pop()
        if is_scope(s):
            continue
        if isinstance(s, (ast.For, ast.AsyncFor, ast.While)) and any(sets_flag(b, flag) for b in s.body):
            found.append(s)
        for inner in stmt_blocks(s):
            stack.extend(inner)
    return found


def dead_on_exit(node: ast.If, outputs: list[str], live: Liveness, ctx: Context) -> tuple[str, ...]:
    """Outputs of a guarded `if` whose values nobody reads once one of its exit flags is set.

    After `return` only the return value counts; after `break` what is live after the loop;
    after `continue` what is live at the loop header (the next iteration). Exit flags keep
    their values (they say which exit was taken). Unknown exits: nothing is dead.
    """
    flags = getattr(node, "_dycl_flags", None)
    if not flags:
        return ()
    keep = set(flags) | set(ctx.exits) | {RETVAL}
    for flag in flags:
        kind, loop = ctx.exits.get(flag, (None, None))
        if kind == "return":
            continue
        if kind == "break" and id(loop) in live.cfg.join:
            keep |= live.after(loop)
        elif kind == "continue" and id(loop) in live.cfg.header:
            keep |= live.header(loop)
        else:  # e.g. the loop is already converted: assume everything is read
            return ()
    return tuple(n for n in outputs if n not in keep)
