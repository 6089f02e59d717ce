"""Drops a local list that is only ever appended to (`skipped = []`, `skipped.append(t)`, never read):
its appends change nothing the method returns, yet a one-sided append would make the branches differ."""
from __future__ import annotations

import ast

from dycl_jax.analysis.scopes import function_locals, param_names
from dycl_jax.rewrite.templates import Context, is_scope, own_statements

_APPENDS = {"append", "insert"}  # not `extend`: it may consume an iterator that is read later
# calls whose only effect is their value (an appended `g.item()`, `len(xs)`, `int(t)`)
_PURE_METHODS = {"item", "tolist", "detach", "clone", "cpu", "float", "int", "long", "numel", "size", "dim"}
_PURE_BUILTINS = {"int", "float", "bool", "len", "str", "round", "abs"}


def _pure(node: ast.expr, local: set[str]) -> bool:
    """True when evaluating `node` can have no effect besides its value."""
    if isinstance(node, (ast.Name, ast.Constant)):
        return True
    if isinstance(node, ast.Attribute):
        return _pure(node.value, local)
    if isinstance(node, ast.Subscript):
        return _pure(node.value, local) and _pure(node.slice, local)
    if isinstance(node, ast.Slice):
        return all(_pure(p, local) for p in (node.lower, node.upper, node.step) if p is not None)
    if isinstance(node, ast.BinOp):
        return _pure(node.left, local) and _pure(node.right, local)
    if isinstance(node, ast.UnaryOp):
        return _pure(node.operand, local)
    if isinstance(node, ast.Compare):
        return _pure(node.left, local) and all(_pure(c, local) for c in node.comparators)
    if isinstance(node, (ast.Tuple, ast.List)):
        return all(_pure(e, local) for e in node.elts)
    if isinstance(node, ast.Call) and not node.keywords:
        f = node.func
        known = (isinstance(f, ast.Attribute) and f.attr in _PURE_METHODS and _pure(f.value, local)) or \
                (isinstance(f, ast.Name) and f.id in _PURE_BUILTINS and f.id not in local)
        return known and all(_pure(a, local) for a in node.args)
    return False


def _empty_list(value: ast.expr) -> bool:
    return (isinstance(value, ast.List) and not value.elts) or \
        (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "list"
         and not value.args and not value.keywords)


def _append_on(s: ast.stmt, local: set[str]) -> str | None:
    """`xs` for a statement `xs.append(<pure>)` / `xs.insert(<pure>, <pure>)`."""
    if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)):
        return None
    call = s.value
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr in _APPENDS and isinstance(f.value, ast.Name) \
            and not call.keywords and all(_pure(a, local) for a in call.args):
        return f.value.id
    return None


def _uses(scope: ast.FunctionDef) -> tuple[dict[str, int], set[str]]:
    """(name -> occurrences in the scope's own code, names seen inside nested scopes)."""
    counts: dict[str, int] = {}
    nested: set[str] = set()

    def walk(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            deeper = inside or is_scope(child) or isinstance(child, (ast.ListComp, ast.SetComp, ast.DictComp,
                                                                       ast.GeneratorExp))
            if isinstance(child, ast.Name):
                if deeper:
                    nested.add(child.id)
                else:
                    counts[child.id] = counts.get(child.id, 0) + 1
            elif isinstance(child, (ast.Global, ast.Nonlocal)):
                nested.update(child.names)
            walk(child, deeper)
    walk(scope, False)
    return counts, nested


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    local = function_locals(scope)
    candidates = local - param_names(scope)
    if not candidates:
        return
    inits: dict[str, list] = {}
    appends: dict[str, list] = {}
    for s, block in own_statements(scope):
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) \
                and _empty_list(s.value):
            inits.setdefault(s.targets[0].id, []).append((s, block))
        target = _append_on(s, local)
        if target is not None:
            appends.setdefault(target, []).append((s, block))
    counts, nested = _uses(scope)
    for var in sorted(candidates & set(appends) & set(inits)):
        # every occurrence of the name is one of these statements: nothing else reads or binds it
        if var in nested or counts.get(var, 0) != len(inits[var]) + len(appends[var]):
            continue
        first = ast.unparse(appends[var][0][0]).splitlines()[0]
        lines = ", ".join(str(s.lineno) for s, _ in appends[var])
        ctx.warn(inits[var][0][0].lineno, f"dropped `{first}` (line {lines}) and the list `{var}` from the "
                                          f"rewritten {ctx.src.qualname}: the list is never read, so it does "
                                          "not affect the outputs")
        for s, block in appends[var] + inits[var]:
            i = next(k for k, t in enumerate(block) if t is s)
            block[i] = ast.copy_location(ast.Pass(), s)
