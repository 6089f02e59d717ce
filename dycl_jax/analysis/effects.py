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


def mark(tree: ast.FunctionDef, methods: CallEffects, functions: CallEffects, self_name: str | None) -> None:
    """Record on each call of a user method (`self.bumped(v)`) or user function (`bump(v)`) whose
    effects are known which of the caller's names it may update in place (`_dycl_updates`, read
    by `scopes.access`) and which it may return (`_dycl_returns`, read by `aliases`)."""
    local = function_locals(tree)
    by_method, by_function = dict(methods), dict(functions)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        found: tuple[Effects, ...] = ()
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == self_name:
            found = by_method.get(func.attr, ())
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
