"""Shared by the early-exit converters: flag tests and guarding the rest of a block.

Statements after a possible exit run only while no exit flag is set. Guards are kept flat
rather than nested (every level of nested torch.cond multiplies export time): a run of
simple statements gets one guard, an `if` without `else` and a `while` take the flag into
their own test, a `for` loop stops through its exit flags. Each guard reads the flag as it
is at that point, so a later exit in the same block needs nothing more.
"""
from __future__ import annotations

import ast

from dycl_jax.rewrite.templates import is_scope, locate, name, stmt_blocks

_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Match,
             ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


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
        elif not isinstance(s, _COMPOUND):
            group.append(s)
        elif isinstance(s, (ast.If, ast.While)) and not (isinstance(s, ast.If) and s.orelse):
            flush()
            s.test = _with_flags(s.test, flags)
            s._dycl_static = False  # type: ignore[attr-defined]
            s._dycl_flags = getattr(s, "_dycl_flags", set()) | set(flags)  # type: ignore[attr-defined]
            out.append(s)
        elif isinstance(s, (ast.For, ast.AsyncFor)):
            flush()
            s._dycl_exit_flags = getattr(s, "_dycl_exit_flags", []) + list(flags)  # type: ignore[attr-defined]
            out.append(s)
        else:
            flush()
            out.append(guard_if([s], flags))
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
