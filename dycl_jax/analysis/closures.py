"""Finds nested functions whose closure would go stale once the enclosing branches are rewritten."""
from __future__ import annotations

import ast
from dataclasses import dataclass

_COMPOUND = (ast.If, ast.While, ast.For, ast.AsyncFor)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


@dataclass(frozen=True)
class ClosureHazard:
    """`function` (defined at `line`) reads `variable`, which the construct at `construct_line`
    reassigns before calling it. `definition` is its `def` (or `f = lambda ...`) statement;
    `construct` the if/while/for. `refreshable`: its definition can run again at the start of the
    construct's bodies (`refreshable`), so that the copy there reads the construct's own values."""

    function: str
    variable: str
    line: int
    construct_line: int
    definition: ast.AST | None = None
    construct: ast.AST | None = None
    refreshable: bool = False


def _walk_scope(node: ast.AST):
    """Nodes of one scope, not descending into nested functions or classes."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        n = stack.pop()
        yield n
        if not isinstance(n, _SCOPES):
            stack.extend(ast.iter_child_nodes(n))


def _free_reads(fn: ast.FunctionDef | ast.Lambda) -> set[str]:
    args = fn.args
    params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    params |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    body = fn.body if isinstance(fn.body, list) else [fn.body]
    loads, stores = set(), set(params)
    for stmt in body:
        for n in [stmt, *ast.walk(stmt)]:
            if isinstance(n, ast.Name):
                (loads if isinstance(n.ctx, ast.Load) else stores).add(n.id)
    return loads - stores


def _nested_functions(scope: ast.FunctionDef) -> dict[str, tuple[ast.AST, set[str]]]:
    found: dict[str, tuple[ast.AST, set[str]]] = {}
    for n in _walk_scope(scope):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[n.name] = (n, _free_reads(n))
        elif isinstance(n, ast.Assign) and isinstance(n.value, ast.Lambda):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    found[t.id] = (n, _free_reads(n.value))
    return found


def closure_hazards(scope: ast.FunctionDef) -> list[ClosureHazard]:
    """Nested functions defined outside an if/while/for that call sites inside it reach after
    the construct reassigned a variable they close over.

    Rewritten branch and loop bodies become functions that receive and return their variables,
    so the enclosing cell is updated only after the construct ends: a closure called inside it
    would still see the old value. Reported conservatively (any such call inside the construct).
    """
    nested = _nested_functions(scope)
    hazards = []
    for construct in _walk_scope(scope):
        if not isinstance(construct, _COMPOUND):
            continue
        inner = [n for stmt in construct.body + construct.orelse for n in [stmt, *_walk_scope(stmt)]]
        stored = {n.id for n in inner if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        called = {n.id for n in inner if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        for name in sorted(called & set(nested)):
            node, free = nested[name]
            if node in inner:  # defined inside the construct: it closes over the branch's own locals
                continue
            ok = refreshable(scope, node, name) and name not in stored
            for var in sorted(free & stored):
                hazards.append(ClosureHazard(name, var, node.lineno, construct.lineno, node, construct, ok))
    return hazards


def stale_after_rebind(scope: ast.FunctionDef) -> list[ClosureHazard]:
    """Nested functions used after a later statement of the scope reassigns a variable they close
    over (`s = s + k; y = f(x)`). The dispatch host opens a closure into its values when a
    compiled region starts, so such a use would read the old value; `construct_line` is the
    reassignment's line. Reported conservatively (any use after it, or any use at all when the
    reassignment is in a loop)."""
    nested = _nested_functions(scope)
    if not nested:
        return []
    names = [n for n in _walk_scope(scope) if isinstance(n, ast.Name)]  # the scope's own, not nested functions'
    looped = {id(n) for loop in _walk_scope(scope) if isinstance(loop, (ast.While, ast.For, ast.AsyncFor))
              for n in ast.walk(loop)}
    hazards = []
    for name, (node, free) in sorted(nested.items()):
        stores = [n for n in names if isinstance(n.ctx, ast.Store) and n.id in free and n.lineno > node.lineno]
        uses = [n.lineno for n in names if n.id == name and isinstance(n.ctx, ast.Load)]
        for store in stores:  # in a loop, a use before the store reads it on the next iteration
            if any(line >= store.lineno or id(store) in looped for line in uses):
                hazards.append(ClosureHazard(name, store.id, node.lineno, store.lineno, node, None, False))
                break
    return hazards


def refreshable(scope: ast.FunctionDef, definition: ast.AST, name: str) -> bool:
    """Running `definition` again elsewhere in the scope makes the same function, closing over the
    same variables: it is the scope's only binding of `name`, has no decorators, defaults or
    `nonlocal` / `global` (run again, they would be evaluated anew or rebind), and does not call
    itself by name (a copy would call the original)."""
    fn = definition.value if isinstance(definition, ast.Assign) else definition
    if isinstance(definition, ast.Assign) and (len(definition.targets) != 1 or not isinstance(definition.targets[0], ast.Name)):
        return False
    if not isinstance(fn, (ast.FunctionDef, ast.Lambda)) or getattr(fn, "decorator_list", []) \
            or fn.args.defaults or any(d is not None for d in fn.args.kw_defaults):
        return False
    body = fn.body if isinstance(fn.body, list) else [fn.body]
    inner = [n for stmt in body for n in ast.walk(stmt)]
    if any(isinstance(n, (ast.Nonlocal, ast.Global, ast.Yield, ast.YieldFrom, ast.Await)) for n in inner) \
            or any(isinstance(n, ast.Name) and n.id == name for n in inner):
        return False
    bindings = [n for n in _walk_scope(scope)
                if (isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name)
                or (isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load))]
    return len(bindings) == 1
