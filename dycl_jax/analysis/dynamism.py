"""The static/dynamic decision: which predicates are provably Python values, and what to rewrite.

The final decision is made at run time by the operators from the actual value (a Python
bool runs Python, a tensor emits a graph op). This module only proves predicates static
(those stay plain Python `if`s) and finds the constructs that must be rewritten.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

# calls whose result is always a Python value, whatever the arguments
_PY_CALLS = {"isinstance", "issubclass", "hasattr", "callable", "len", "type", "id"}
# attributes / methods of tensors that describe metadata, not data (SymInts at worst)
_META_ATTRS = {"shape", "ndim", "dtype", "device", "is_cuda", "requires_grad", "training", "is_floating_point"}
_META_CALLS = {"dim", "size", "numel", "is_floating_point", "is_complex", "ndimension"}


def is_static(expr: ast.expr, shadowed: set[str] = frozenset()) -> bool:
    """True when `expr` can only evaluate to a Python value (or a shape SymBool)."""
    if isinstance(expr, ast.Constant):
        return True
    if isinstance(expr, ast.UnaryOp):
        return is_static(expr.operand, shadowed)
    if isinstance(expr, ast.BoolOp):
        return all(is_static(v, shadowed) for v in expr.values)
    if isinstance(expr, ast.Compare):
        if all(isinstance(op, (ast.Is, ast.IsNot)) for op in expr.ops):
            return True
        return all(is_static(v, shadowed) for v in (expr.left, *expr.comparators))
    if isinstance(expr, ast.BinOp):
        return is_static(expr.left, shadowed) and is_static(expr.right, shadowed)
    if isinstance(expr, ast.Attribute):
        return expr.attr in _META_ATTRS
    if isinstance(expr, ast.Subscript):
        return is_static(expr.value, shadowed) and is_static(expr.slice, shadowed)
    if isinstance(expr, (ast.Tuple, ast.List)):
        return all(is_static(e, shadowed) for e in expr.elts)
    if isinstance(expr, ast.Call):
        f = expr.func
        if isinstance(f, ast.Name) and f.id in _PY_CALLS and f.id not in shadowed:
            return True
        return isinstance(f, ast.Attribute) and f.attr in _META_CALLS
    return False


@dataclass(frozen=True)
class Construct:
    """One place the rewrite must handle, for the record and `needs_rewrite`."""

    kind: str  # if | while | ifexp | boolop | early-return | loop-exit
    line: int
    static: bool


def _tail_returns_only(body: list[ast.stmt]) -> bool:
    """True if every `return` is the final statement of the function body."""
    for i, s in enumerate(body):
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for node in [s, *_own_nodes(s)]:
            if isinstance(node, ast.Return) and not (node is s and i == len(body) - 1):
                return False
    return True


def _own_nodes(fn: ast.AST):
    """Nodes of a function, not entering nested defs/classes (they are separate scopes)."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def constructs(fn: ast.FunctionDef, shadowed: set[str] = frozenset()) -> list[Construct]:
    """Control-flow constructs of one function scope (nested defs are scanned separately)."""
    found = []
    for node in _own_nodes(fn):
        if isinstance(node, (ast.If, ast.While)):
            found.append(Construct("if" if isinstance(node, ast.If) else "while", node.lineno,
                                   is_static(node.test, shadowed)))
        elif isinstance(node, ast.IfExp):
            found.append(Construct("ifexp", node.lineno, is_static(node.test, shadowed)))
        elif isinstance(node, ast.BoolOp) or isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            found.append(Construct("boolop", node.lineno, is_static(node, shadowed)))
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            for inner in _loop_exits(node):
                found.append(Construct("loop-exit", inner.lineno, False))
    if not _tail_returns_only(fn.body):
        found.append(Construct("early-return", fn.lineno, False))
    return found


def _loop_exits(loop: ast.stmt):
    """break / continue of this loop, and returns anywhere inside it."""
    stack = list(loop.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Break, ast.Continue, ast.Return)):
            yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            stack.extend(n for n in ast.walk(node) if isinstance(n, ast.Return))
            continue
        stack.extend(ast.iter_child_nodes(node))


def needs_rewrite(fn: ast.FunctionDef, shadowed: set[str] = frozenset()) -> bool:
    """Whether any construct of `fn` (or of a function nested in it) may depend on tensor values."""
    scopes = [fn] + [n for n in ast.walk(fn) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n is not fn]
    return any(not c.static for scope in scopes for c in constructs(scope, shadowed))
