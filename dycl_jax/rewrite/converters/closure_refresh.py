"""Nested functions defined again inside a construct that reassigns a variable they read, so the converted body's copy reads its new value."""
from __future__ import annotations

import ast
import copy

from dycl_jax.analysis.closures import ClosureHazard, closure_hazards
from dycl_jax.rewrite.templates import Context, is_scope, locate


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    """For each refreshable hazard (`analysis/closures.py`: `def f(t): return t + s`, then a
    construct that reassigns `s` and calls `f`), innermost construct first: a copy of the
    definition under a fresh name begins each body of the construct, and the body calls the copy.
    Once the body is a separate function, the copy closes over that function's `s`, which is the
    construct's current value, as the original reads the scope's current `s` in Python; where the
    construct stays Python, the copy reads the same variables as the original."""
    done: set[tuple[int, str]] = set()
    hazards = [h for h in closure_hazards(scope) if h.refreshable]
    for h in sorted(hazards, key=lambda h: -_depth(scope, h.construct)):
        if (id(h.construct), h.function) in done:
            continue
        done.add((id(h.construct), h.function))
        fresh = ctx.fresh(f"fn_{h.function}")
        for block in _bodies(h.construct):
            _rename(block, h.function, fresh)
            block.insert(0, locate(_copy(h.definition, fresh), block[0]))


def _depth(scope: ast.AST, target: ast.AST | None) -> int:
    def walk(node: ast.AST, d: int) -> int:
        if node is target:
            return d
        for child in ast.iter_child_nodes(node):
            if not is_scope(child):
                found = walk(child, d + 1)
                if found >= 0:
                    return found
        return -1
    return walk(scope, 0)


def _bodies(construct: ast.AST) -> list[list[ast.stmt]]:
    """The statement lists that become body functions; an `elif` (an `else:` holding one `if`) stays
    the `if` alone, so the chain is still recognised: its own bodies take the copy."""
    found: list[list[ast.stmt]] = []

    def add(block: list[ast.stmt]) -> None:
        if len(block) == 1 and isinstance(block[0], ast.If) and block is not construct.body:
            add(block[0].body)
            add(block[0].orelse)
        elif block:
            found.append(block)

    add(construct.body)
    add(construct.orelse)
    return found


def _copy(definition: ast.AST, fresh: str) -> ast.stmt:
    new = copy.deepcopy(definition)
    if isinstance(new, ast.Assign):
        new.targets = [ast.Name(id=fresh, ctx=ast.Store())]
    else:
        new.name = fresh
    return new


def _rename(block: list[ast.stmt], old: str, fresh: str) -> None:
    """Reads of `old` in `block` (not inside nested functions that bind it) become `fresh`."""
    stack: list[ast.AST] = list(block)
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Name) and n.id == old and isinstance(n.ctx, ast.Load):
            n.id = fresh
        if is_scope(n) and hasattr(n, "args") and any(isinstance(m, ast.arg) and m.arg == old for m in ast.walk(n.args)):
            continue
        stack.extend(ast.iter_child_nodes(n))
