"""Which local names may hold (or contain, or view) the same tensor: a flow-insensitive may-alias relation."""
from __future__ import annotations

import ast

# methods that return a view of the tensor they are called on (or the tensor itself)
_VIEWS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "t", "transpose", "permute", "squeeze", "unsqueeze", "expand",
    "expand_as", "narrow", "select", "flatten", "unflatten", "detach", "as_strided", "unfold", "diagonal",
    "movedim", "swapaxes", "split", "chunk", "unbind", "contiguous", "requires_grad_", "type_as", "to",
})


class Aliases:
    """Union-find over names connected by assignments that may make them the same tensor:
    `a = v`, `a, b = v, w`, `a = v if c else w`, `xs = [v]` / `xs.append(v)` / `xs[0] = v` (a
    container and what it holds), `a = xs[0]`, `for a in xs`, `a = v.view(...)` and other views,
    `a = v.mul_(s)` (an in-place method returns its tensor), `a = self.same(v)` (a user method
    that may return its argument: `effects.mark`).
    Over-approximate on purpose: a pair it misses could lose an in-place update."""

    def __init__(self, scope: ast.AST) -> None:
        self._parent: dict[str, str] = {}
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    self._bind(target, node.value)
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                self._bind(node.target, node.value)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                self._bind(node.target, node.iter)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("append", "extend", "insert", "add", "update", "setdefault") \
                    and isinstance(node.func.value, ast.Name):
                for arg in node.args:
                    self._join(node.func.value.id, sources(arg))

    def _find(self, n: str) -> str:
        while self._parent.get(n, n) != n:
            n = self._parent[n]
        return n

    def _join(self, n: str, others: set[str]) -> None:
        for m in others:
            a, b = self._find(n), self._find(m)
            if a != b:
                self._parent[b] = a

    def _bind(self, target: ast.AST, value: ast.AST) -> None:
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
                and len(target.elts) == len(value.elts) and not any(isinstance(e, ast.Starred) for e in target.elts):
            for t, v in zip(target.elts, value.elts):
                self._bind(t, v)
            return
        names = _targets(target)
        if not names:
            return
        first = next(iter(names))
        if isinstance(target, (ast.Subscript, ast.Attribute)):
            # `xs[0] = v` stores the tensor in a list (or an object); `a[0, 5] = h[1, 5]` copies values
            self._join(first, _held(value))
            return
        if isinstance(target, (ast.Tuple, ast.List, ast.Starred)):
            # `a, b = pair`: each may be any element of the value (one class: the relation is a union)
            for n in names:
                self._join(n, sources(value))
            return
        self._join(first, sources(value))
        self._join(first, names - {first})

    def same(self, n: str, m: str) -> bool:
        return self._find(n) == self._find(m)


def _in_place(method: str) -> bool:
    """`add_`, `mul_`, `clamp_`, `masked_fill_`, ...: torch's in-place methods end in one underscore."""
    return method.endswith("_") and not method.startswith("_")


def _targets(target: ast.AST) -> set[str]:
    """Names a target binds, or the container it stores into (`xs[0] = v`, `o.x = v`: xs, o)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, ast.Starred):
        return _targets(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_targets(e) for e in target.elts)) if target.elts else set()
    if isinstance(target, (ast.Subscript, ast.Attribute)):
        return _targets(target.value)
    return set()


def _held(value: ast.AST) -> set[str]:
    """Names whose tensors a value stored into a container is (or holds) by reference."""
    if isinstance(value, ast.Name):
        return {value.id}
    if isinstance(value, (ast.Tuple, ast.List)):
        return set().union(*(_held(e) for e in value.elts)) if value.elts else set()
    return set()


def sources(value: ast.AST) -> set[str]:
    """Names whose tensor the value may be, hold or view."""
    if isinstance(value, ast.Name):
        return {value.id}
    if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(sources(e) for e in value.elts)) if value.elts else set()
    if isinstance(value, ast.Dict):
        return set().union(*(sources(e) for e in value.values)) if value.values else set()
    if isinstance(value, ast.Starred):
        return sources(value.value)
    if isinstance(value, ast.IfExp):
        return sources(value.body) | sources(value.orelse)
    if isinstance(value, ast.BoolOp):
        return set().union(*(sources(e) for e in value.values))
    if isinstance(value, ast.NamedExpr):
        return {value.target.id} | sources(value.value)  # type: ignore[union-attr]
    if isinstance(value, (ast.Subscript, ast.Attribute)):
        return sources(value.value)  # an element, a slice (a view), `v.T`, `v.data`
    if isinstance(value, ast.Call) and hasattr(value, "_dycl_returns"):
        # a user method or function that may return (a view of) an argument (`effects.mark`)
        return set(value._dycl_returns)  # type: ignore[attr-defined]
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and (value.func.attr in _VIEWS or _in_place(value.func.attr)):
        return sources(value.func.value)  # (an in-place method, `v.mul_(s)`, returns its tensor)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("list", "tuple", "iter",
                                                                                              "reversed", "zip", "enumerate"):
        return set().union(*(sources(a) for a in value.args)) if value.args else set()
    return set()
