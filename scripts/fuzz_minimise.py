"""Shrinks a fuzz program that shows a bug to the fewest `forward` statements that still show it.

Greedy statement-level reduction over the AST of the program's `forward` methods (the module
`Fuzzed` and its submodule `Sub`; `__init__` is kept, so the weights seeded by the seed stay
the same): remove a run of statements, or replace an `if`/`for`/`while` by one of its bodies,
keep the change whenever `fails(source)` still holds, and repeat until no single change keeps
it. `fails` is the oracle (scripts/fuzz.py's `check(...).kind == "bug"`, the same kind of
failure): a change that makes the program invalid (a name used before it is assigned) or that
makes the bug go away is undone.
"""
from __future__ import annotations

import ast
import copy
import time
from dataclasses import dataclass
from typing import Callable, Iterator

Fails = Callable[[str], bool]
_COMPOUND = (ast.If, ast.For, ast.While)


@dataclass
class Minimised:
    source: str
    statements: tuple[int, int]  # forward statements (nested ones included) before and after
    checks: int  # oracle calls made
    complete: bool  # False when the check budget or deadline ended the search first


def minimise(source: str, fails: Fails, max_checks: int = 400, deadline: float | None = None) -> Minimised:
    """The smallest program found that still `fails`; `source` must fail to begin with."""
    tree = ast.parse(source)
    before = _count(tree)
    checks = 0
    changed = True
    while changed:
        changed = False
        current = ast.unparse(tree)
        for candidate in _candidates(tree):
            text = ast.unparse(candidate)
            if text == current:  # removing a block's only `pass` gives it back
                continue
            if not _compiles(text):  # flattening a loop can leave its `break` outside any loop
                continue
            if checks >= max_checks or (deadline is not None and time.time() > deadline):
                return Minimised(current, (before, _count(tree)), checks, False)
            checks += 1
            if fails(text):
                tree, changed = candidate, True
                break  # start again over the smaller program: its blocks and indices moved
    return Minimised(ast.unparse(tree), (before, _count(tree)), checks, True)


def _compiles(text: str) -> bool:
    try:
        compile(text, "<candidate>", "exec")
    except SyntaxError:
        return False
    return True


def _forwards(tree: ast.Module) -> list[ast.FunctionDef]:
    return [f for c in tree.body if isinstance(c, ast.ClassDef)
            for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "forward"]


def _blocks(stmts: list[ast.stmt]) -> Iterator[list[ast.stmt]]:
    """Every statement list inside `stmts`, outer first."""
    yield stmts
    for s in stmts:
        if isinstance(s, _COMPOUND):
            yield from _blocks(s.body)
            if s.orelse:
                yield from _blocks(s.orelse)


def _count(tree: ast.Module) -> int:
    return sum(len(b) for f in _forwards(tree) for b in _blocks(f.body))


def _candidates(tree: ast.Module) -> Iterator[ast.Module]:
    """Smaller programs, larger cuts first: halves and quarters of each block, then single
    statements, then compound statements replaced by a body. Each is a fresh copy."""
    for which in ("runs", "single", "flatten"):
        n_blocks = sum(1 for f in _forwards(tree) for _ in _blocks(f.body))
        for k in range(n_blocks):
            size = len(_block(tree, k))
            if which == "runs":
                for width in sorted({size // 2, size // 4} - {0, 1}, reverse=True):
                    for start in range(0, size - width + 1, width):
                        yield _edited(tree, k, lambda b, s=start, w=width: b[:s] + b[s + w:])
            elif which == "single":
                for i in range(size):
                    yield _edited(tree, k, lambda b, i=i: b[:i] + b[i + 1:])
            else:
                for i in range(size):
                    if isinstance(_block(tree, k)[i], _COMPOUND):
                        for part in ("body", "orelse"):
                            yield _edited(tree, k, lambda b, i=i, p=part: b[:i] + getattr(b[i], p) + b[i + 1:])


def _block(tree: ast.Module, k: int) -> list[ast.stmt]:
    return [b for f in _forwards(tree) for b in _blocks(f.body)][k]


def _edited(tree: ast.Module, k: int, edit: Callable[[list[ast.stmt]], list[ast.stmt]]) -> ast.Module:
    """A copy of `tree` whose k-th block is `edit(block)` (`pass` where that leaves it empty)."""
    new = copy.deepcopy(tree)
    block = _block(new, k)
    block[:] = edit(list(block)) or [ast.Pass()]
    return ast.fix_missing_locations(new)
