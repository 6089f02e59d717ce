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
    if not params:
        return Effects(positional, frozenset(), frozenset())
    aliases = Aliases(tree)
    fresh = _rebound_first(tree.body, set(params))
    mutated = block_access(tree.body).mutates
    returned = set().union(*(sources(n.value) for n in ast.walk(tree)
                             if isinstance(n, ast.Return) and n.value is not None and _own(n, tree)))
    kept = [p for p in params if p not in fresh]
    return Effects(positional,
                   frozenset(p for p in kept if any(aliases.same(p, m) for m in mutated)),
                   frozenset(p for p in kept if any(aliases.same(p, r) for r in returned)))


def _own(node: ast.Return, tree: ast.FunctionDef) -> bool:
    """Whether `node` returns from `tree` itself, not from a function nested in it."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        n = stack.pop()
        if n is node:
            return True
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(n))
    return False


def _rebound_first(body: list[ast.stmt], params: set[str]) -> set[str]:
    """Parameters whose first use is a rebinding to a new tensor (`t = t.clone()`, `x = x * 2`):
    the caller's tensor is never seen again under that name (nor under any other, none was bound)."""
    fresh: set[str] = set()
    pending = set(params)
    for s in body:
        acc = access(s)
        used = (acc.reads | acc.writes) & pending
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) \
                and s.targets[0].id in used:
            p = s.targets[0].id
            value = access(s.value)
            if p not in sources(s.value) and p not in value.mutates and not (used - {p}):
                fresh.add(p)
        pending -= used
        if not pending:
            break
    return fresh


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
            node._dycl_updates = frozenset().union(*(_arguments(node, e, e.updates) for e in found))  # type: ignore[attr-defined]
            node._dycl_returns = frozenset().union(*(_arguments(node, e, e.returns) for e in found))  # type: ignore[attr-defined]


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
