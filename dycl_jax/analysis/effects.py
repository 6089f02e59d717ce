"""What a called user function does to its tensor arguments: which it may update in place and which it may return."""
from __future__ import annotations

import ast
from dataclasses import dataclass

from dycl_jax.analysis.aliases import Aliases, sources
from dycl_jax.analysis.scopes import access, block_access, function_locals


@dataclass(frozen=True)
class Effects:
    """A function's effects on its parameters (named as in its `def`, `self` left out): those it
    may update in place while they still hold the caller's tensor, and those whose tensor (or a
    view of it) it may return. Over-approximate: a missed update could be lost by a caller."""

    params: tuple[str, ...]  # positional parameters, in order
    updates: frozenset[str]
    returns: frozenset[str]

    def __bool__(self) -> bool:
        return bool(self.updates or self.returns)


# a torch leaf module built with `inplace=True` (nn.ReLU, nn.Dropout, ...) updates and returns its input
IN_PLACE_MODULE = Effects(("input",), frozenset({"input"}), frozenset({"input"}))


def summarize(tree: ast.FunctionDef, skip: int) -> Effects:
    """The effects of `tree` (its calls already `mark`ed), its first `skip` parameters (`self`) left out."""
    args = tree.args
    positional = tuple(a.arg for a in (*args.posonlyargs, *args.args))[skip:]
    params = (*positional, *(a.arg for a in args.kwonlyargs),
              *(a.arg for a in (args.vararg, args.kwarg) if a is not None))
    aliases = Aliases(tree)
    updates, returns = set(), set()
    for p in params:
        # after a top-level `p = <new tensor>` (`x = self.conv(x)`, `t = t.clone()`), `p` no longer
        # holds the caller's tensor; names bound to it before still may (`residual = x`)
        r = _rebound(tree.body, p)
        before, after = tree.body[:r], tree.body[r + 1:] if r is not None else []
        mutated = block_access(before).mutates | (block_access(after).mutates - {p})
        returned = _returned(before) | (_returned(after) - {p})
        if any(aliases.same(p, m) for m in mutated):
            updates.add(p)
        if any(aliases.same(p, n) for n in returned):
            returns.add(p)
    return Effects(positional, frozenset(updates), frozenset(returns))


def _rebound(body: list[ast.stmt], p: str) -> int | None:
    """The index of the first top-level statement that binds `p` to a tensor that is not (a view
    of) the one it held, without updating that one: `p = p * 2`, `p = self.conv(p)`."""
    for i, s in enumerate(body):
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) \
                and s.targets[0].id == p:
            if p not in sources(s.value) and p not in access(s.value).mutates:
                return i
            return None  # `p = p.view(-1)`: still (a view of) the caller's tensor
    return None


def _returned(stmts: list[ast.stmt]) -> set[str]:
    """Names whose tensor a `return` among `stmts` may give back (not a nested function's return)."""
    found: set[str] = set()
    stack: list[ast.AST] = list(stmts)
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Return) and n.value is not None:
            found |= sources(n.value)
        elif not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(n))
    return found


CallEffects = tuple[tuple[str, tuple[Effects, ...]], ...]  # (name, what each function it may call does)


def element_key(container: str) -> str:
    """The `CallEffects` name of any element of the module container `self.<container>`."""
    return f"{container}[]"


def mark(tree: ast.FunctionDef, methods: CallEffects, functions: CallEffects, self_name: str | None) -> None:
    """Record on each call of a user method (`self.bumped(v)`) or user function (`bump(v)`) whose
    effects are known which of the caller's names it may update in place (`_dycl_updates`, read
    by `scopes.access`) and which it may return (`_dycl_returns`, read by `aliases`). A call of an
    element of a module container (`self.blocks[i](h)`, or `blk(h)` where the function binds `blk`
    to its elements: `for blk in self.blocks`, `enumerate`/`zip` of it, `blk = self.blocks[i]`)
    may run any element's forward: their effects, joined."""
    local = function_locals(tree)
    by_method, by_function = dict(methods), dict(functions)
    elements = _element_names(tree, self_name) if self_name is not None else {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        found: tuple[Effects, ...] = ()
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == self_name:
            found = by_method.get(func.attr, ())
        elif _container(func, self_name) is not None:
            found = by_method.get(element_key(_container(func, self_name)), ())
        elif isinstance(func, ast.Name) and func.id in elements:
            found = tuple(e for c in sorted(elements[func.id]) for e in by_method.get(element_key(c), ()))
        elif isinstance(func, ast.Name) and func.id not in local:
            found = by_function.get(func.id, ())
        if any(found):
            updates = frozenset().union(*(_arguments(node, e, e.updates) for e in found))
            returns = frozenset().union(*(_arguments(node, e, e.returns) for e in found))
            node._dycl_updates, node._dycl_returns = updates, returns  # type: ignore[attr-defined]


def _arguments(call: ast.Call, effects: Effects, params: frozenset[str]) -> set[str]:
    """The caller's names passed (as they are, indexed or viewed) for the parameters `params`;
    every argument's where the call spreads `*args` / `**kwargs`."""
    if not params:
        return set()
    passed = set(effects.params) | {k.arg for k in call.keywords}
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords) \
            or len(call.args) > len(effects.params) or params - passed:  # (`*args` / `**kw` of the callee)
        exprs = [*call.args, *(k.value for k in call.keywords)]
    else:
        exprs = [a for a, p in zip(call.args, effects.params) if p in params]
        exprs += [k.value for k in call.keywords if k.arg in params]
    return set().union(*(sources(e) for e in exprs)) if exprs else set()


def _container(expr: ast.AST, self_name: str | None) -> str | None:
    """`c` where `expr` is `self.c[...]` (an element of a container attribute)."""
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Attribute) \
            and isinstance(expr.value.value, ast.Name) and expr.value.value.id == self_name:
        return expr.value.attr
    return None


def _element_names(tree: ast.FunctionDef, self_name: str) -> dict[str, set[str]]:
    """Local names the function binds to elements of `self.<container>`: loop targets over it
    (directly, or in `enumerate` / `zip` / `reversed`), and `blk = self.blocks[i]`."""
    found: dict[str, set[str]] = {}

    def iterated(target: ast.AST, it: ast.AST) -> None:
        if isinstance(it, ast.Attribute) and isinstance(it.value, ast.Name) and it.value.id == self_name:
            for t in ast.walk(target):  # (unpacked: each name may be an element)
                if isinstance(t, ast.Name):
                    found.setdefault(t.id, set()).add(it.attr)
        elif isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in ("enumerate", "reversed") \
                and it.args:
            iterated(target.elts[1] if it.func.id == "enumerate" and isinstance(target, ast.Tuple)
                     and len(target.elts) == 2 else target, it.args[0])
        elif isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "zip":
            parts = target.elts if isinstance(target, ast.Tuple) and len(target.elts) == len(it.args) else None
            for k, a in enumerate(it.args):
                iterated(parts[k] if parts is not None else target, a)

    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)):
            iterated(node.target, node.iter)
        elif isinstance(node, ast.Assign) and _container(node.value, self_name) is not None:
            for t in node.targets:
                if isinstance(t, ast.Name):
                    found.setdefault(t.id, set()).add(_container(node.value, self_name))
    return found
