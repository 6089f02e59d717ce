"""Drops statements whose only effect is outside the outputs: print, logging, `self.` lists and counters."""
from __future__ import annotations

import ast

from dycl_jax.analysis.scopes import function_locals
from dycl_jax.rewrite.converters.self_attributes import read_elsewhere
from dycl_jax.rewrite.templates import Context, own_statements

_LOG_ROOTS = {"logging", "logger", "log", "_logger", "LOGGER", "_log", "warnings"}
_LOG_CALLS = {"debug", "info", "warning", "warn", "error", "critical", "exception", "log"}
_MUTATORS = {"append", "extend", "insert", "add", "update", "clear", "pop", "remove", "setdefault", "appendleft"}


def _self_attr(node: ast.AST, self_name: str | None) -> str | None:
    """'x' for self.x, self.x.y, self.x[i] (the attribute of self that is touched)."""
    if self_name is None:
        return None
    chain = None
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == self_name:
            chain = node.attr
        node = node.value
    return chain if isinstance(node, ast.Name) and node.id == self_name else None


def _candidate(s: ast.stmt, self_name: str | None, local: set[str]) -> str | None:
    """'print' / 'log' / the self attribute it changes, if `s` is a droppable side effect."""
    if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
        f = s.value.func
        if isinstance(f, ast.Name) and f.id == "print" and "print" not in local:
            return "print"
        if isinstance(f, ast.Attribute):
            root = f
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in _LOG_ROOTS and root.id not in local and f.attr in _LOG_CALLS:
                return "log"
            if f.attr in _MUTATORS:
                return _self_attr(f.value, self_name)
        return None
    if isinstance(s, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = s.targets if isinstance(s, ast.Assign) else [s.target]
        attrs = {_self_attr(t, self_name) if isinstance(t, (ast.Attribute, ast.Subscript)) else None for t in targets}
        if len(attrs) == 1 and None not in attrs:
            return attrs.pop()
    return None


def _self_reads(fn: ast.FunctionDef, self_name: str, skip: set[int]) -> set[str]:
    """Attributes of self read anywhere in the function, outside the statements in `skip`."""
    reads: set[str] = set()
    stack: list[ast.AST] = [fn]
    while stack:
        node = stack.pop()
        if id(node) in skip:
            continue
        attr = _self_attr(node, self_name) if isinstance(node, ast.Attribute) else None
        if attr is not None and isinstance(node.ctx, ast.Load):
            reads.add(attr)
        stack.extend(ast.iter_child_nodes(node))
    return reads


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    top = ctx.src.tree
    self_name = ctx.src.self_name
    local = function_locals(scope)
    found = [(s, block, _candidate(s, self_name, local)) for s, block in own_statements(scope)]
    found = [(s, block, what) for s, block, what in found if what is not None]
    if not found:
        return
    still_read = _self_reads(top, self_name, {id(s) for s, _, _ in found}) if self_name else set()
    if self_name:  # another module's code may read it (`self.block.open` in the parent's forward)
        elsewhere = read_elsewhere(ctx.source_files(), ctx.src.file, ctx.src.line)
        still_read |= {what for _, _, what in found if what in elsewhere or "*" in elsewhere}
    for s, block, what in found:
        if what not in ("print", "log") and what in still_read:
            continue  # the attribute is read again: it may feed the outputs
        code = ast.unparse(s).splitlines()[0]
        ctx.warn(s.lineno, f"dropped `{code}` from the rewritten {ctx.src.qualname}: a side effect that does "
                           "not affect the outputs")
        i = next(k for k, t in enumerate(block) if t is s)
        if len(block) > 1:
            del block[i]
        else:
            block[i] = ast.copy_location(ast.Pass(), s)
