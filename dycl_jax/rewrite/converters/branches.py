"""What a branch or loop body function takes and returns, from liveness."""
from __future__ import annotations

import ast
from dataclasses import dataclass

from dycl_jax.analysis.aliases import Aliases
from dycl_jax.analysis.cfg import Liveness
from dycl_jax.analysis.scopes import block_access, free_names, param_names
from dycl_jax.rewrite.templates import assign, block_statements, const, is_scope, locate, op_call, stmt_blocks, tuple_of


@dataclass
class Signature:
    inputs: list[str]
    outputs: list[str]
    owned: list[set[str]]  # per body: inputs it updates in place (they get a private copy)


def closure_reads(scope: ast.FunctionDef) -> set[str]:
    """Names that user functions nested in the scope read: they may run at any later time."""
    names: set[str] = set()
    for node in ast.walk(scope):
        if node is not scope and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) \
                and not getattr(node, "_dycl_generated", False):
            names |= free_names(node)
    return names


def liveness(scope: ast.FunctionDef) -> Liveness:
    """The scope's liveness. A parameter of a user function that it updates in place
    (`outs.append(h)`, `t.add_(1)`; `pipeline.run` finds them in the user's code, before it changes)
    is live at its exit even when the function never reads it again: the caller's object is the
    same one, so a construct updating it must give the update back."""
    updated = getattr(scope, "_dycl_param_updates", None)
    if updated is None:  # a dispatch island: its parameters are the host's objects
        updated = () if getattr(scope, "_dycl_generated", False) else param_updates(scope)
    return Liveness(scope, closure_reads(scope), set(updated))


def param_updates(scope: ast.FunctionDef) -> frozenset[str]:
    """Parameters whose caller's object `scope` updates in place; one it rebinds anywhere
    (`x = self.first(x)`) is left out: past that, it may not be the caller's."""
    bound = {n.id for n in ast.walk(scope) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    return frozenset(block_access(scope.body).mutates & param_names(scope) - bound - {"self"})


def signature(live: Liveness, bodies: list[list[ast.stmt]], live_after: set[str],
              aliases: Aliases | None = None) -> Signature:
    """Outputs: assigned in some body and live after, and (given the function's aliases) the
    names live after that may hold a tensor some body updates in place: the construct returns
    the updated tensor under each of them. Inputs: read before assigned, plus outputs."""
    accs = [block_access(b) for b in bodies]
    writes = set().union(*(a.writes for a in accs)) & live.locals
    outputs = writes & live_after
    updated = set().union(*(a.mutates | nested_owned(b) for a, b in zip(accs, bodies))) & live.locals
    if updated and aliases is not None:
        outputs |= {m for m in live_after & live.locals if not m.startswith("_dycl_")
                    and any(aliases.same(m, n) for n in updated)}
    outputs = sorted(outputs)
    reads: set[str] = set()
    for body, acc in zip(bodies, accs):
        reads |= live.entry(body) & (acc.reads | acc.mutates)
    inputs = sorted((reads | set(outputs)) & live.locals)
    # an update of a tensor the body made itself (`h = h.clone(); h[:, 0] = 0`) needs no copy of the input
    owned = [((acc.mutates & live.updated_on_entry(body)) | nested_owned(body)) & set(inputs)
             for body, acc in zip(bodies, accs)]
    return Signature(inputs, outputs, owned)


def nested_owned(body: list[ast.stmt]) -> set[str]:
    """Names that a construct already converted inside `body` updates in place: its generated
    functions begin with `own_prefix`'s statement for them, and take them under the same names.
    The enclosing construct updates them too (so it copies them, or refuses a live alias)."""
    names: set[str] = set()
    for node in (n for s in body for n in ast.walk(s)):
        if isinstance(node, ast.FunctionDef) and getattr(node, "_dycl_generated", False) and node.body:
            names |= set(getattr(node.body[0], "_dycl_owned", ()))
    return names


def kept_aliases(live: Liveness, construct: ast.stmt, bodies: list[list[ast.stmt]], outputs: list[str],
                 always_unchanged: bool = False) -> tuple[tuple[str, str], ...]:
    """Pairs (n, m) of `Site.kept_aliases`: n an output that some body does not rebind (or every
    output, for a loop that may not run), m live after the construct, and a statement that may
    run after the construct and updates one of them in place while the other is live after it.
    (An update inside a construct converted already handles its own aliases: `own`, operators.)"""
    binds = [block_access(b).binds for b in bodies]
    unchanged = [n for n in outputs if always_unchanged or any(n not in b for b in binds)]
    if not unchanged:
        return ()
    after = live.after(construct)
    hazards = _hazards(live, construct)
    return tuple(sorted((n, m) for n in unchanged for m in after & live.locals
                        if m != n and not m.startswith("_dycl_") and frozenset((n, m)) in hazards))


def _hazards(live: Liveness, construct: ast.stmt) -> set[frozenset]:
    """Pairs {n, m}: a statement that may run after the construct updates n in place while m is live."""
    return {frozenset(pair) for pair in _updates_after(live, construct)[0]}


def _updates_after(live: Liveness, construct: ast.stmt) -> tuple[set[tuple[str, str]], set[str]]:
    """(n, m): a statement that may run after the construct updates n in place while m is live;
    and the names whose elements such a statement updates (`xs[0].add_(v)`, `Access.deep`)."""
    pairs: set[tuple[str, str]] = set()
    deep: set[str] = set()
    for node in _reachable(live.cfg.join[id(construct)]):
        for n in node.acc.mutates & live.locals:
            live_out = set().union(*(s.live_in for s in node.succ)) if node.succ else set()
            pairs |= {(n, m) for m in live_out - {n}}
        deep |= node.acc.deep
    return pairs, deep


def element_hazards(live: Liveness, construct: ast.stmt, kept: tuple[tuple[str, str], ...]
                    ) -> tuple[tuple[str, str], ...]:
    """Of `kept` (n, m), those where, should the container m hold the tensor n, a later update
    reaches the other: n updated in place while m is live, or m's elements updated while n is.
    (`outputs.append(output)` changes the list, never the tensor it holds.)"""
    if not kept:
        return ()
    pairs, deep = _updates_after(live, construct)
    return tuple(p for p in kept if p in pairs or (p[1] in deep and (p[1], p[0]) in pairs))


_VIEW_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "data", "real", "imag"})
# methods whose result may share memory with their receiver
_VIEWS = frozenset({"view", "view_as", "reshape", "reshape_as", "transpose", "t", "permute", "squeeze", "unsqueeze",
                    "flatten", "unflatten", "narrow", "select", "expand", "expand_as", "detach", "contiguous",
                    "as_strided", "diagonal", "movedim", "swapaxes", "unfold", "chunk", "split", "unbind",
                    "to", "type_as", "float", "double", "half", "long", "int", "bool"})


def object_of(value: ast.expr) -> str | None:
    """The name whose object (or part of its memory) `value` is: `m`, `m[1:]`, `m.t()`, `m.T`.
    (Not `self.layer`: a module's attribute, no local's object.)"""
    while True:
        if isinstance(value, ast.Name):
            return value.id
        if isinstance(value, ast.Subscript) or isinstance(value, ast.Attribute) and value.attr in _VIEW_ATTRIBUTES:
            value = value.value
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _VIEWS:
            value = value.func.value
        else:
            return None


def made_aliases(live: Liveness, construct: ast.stmt, bodies: list[list[ast.stmt]],
                 outputs: list[str]) -> tuple[tuple[str, str], ...]:
    """Pairs (n, m) of `Site.made_aliases`: a body binds output n to m's object (`target = done`,
    `a = v[:, 1:]`), and a statement that may run after the construct updates one of them in
    place while the other is live. (A statement inside a construct converted already is its own.)"""
    made: set[tuple[str, str]] = set()
    for stmt in (s for b in bodies for s, _ in block_statements(b)):
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and stmt.targets[0].id in outputs and (m := object_of(stmt.value)) is not None:
            made.add((stmt.targets[0].id, m))
    if not made:
        return ()
    hazards = _hazards(live, construct)
    return tuple(sorted((n, m) for n, m in made if m != n and m in live.locals and not m.startswith("_dycl_")
                        and frozenset((n, m)) in hazards))


def _reachable(start) -> list:
    seen, stack = {id(start): start}, [start]
    while stack:
        for nxt in stack.pop().succ:
            if id(nxt) not in seen:
                seen[id(nxt)] = nxt
                stack.append(nxt)
    return list(seen.values())


def own_prefix(names: set[str], inputs: list[str], at: ast.AST, deep: set[str] = frozenset()) -> list[ast.stmt]:
    """`x, y, h = _dycl_ops.own((x, y), (h,))` for the inputs x, y a body updates in place: one
    private copy per tensor, which every input name bound to that same tensor then holds (so an
    update through one name reaches its aliases inside the body, as in torch). The statement
    notes which of them the body may update through an element (`deep`, see `deep_updates`)."""
    if not names:
        return []
    owned = sorted(names)
    others = [n for n in inputs if n not in names]
    stmt = locate(assign(owned + others, op_call("own", tuple_of(owned), tuple_of(others))), at)
    stmt._dycl_owned = tuple(owned)  # type: ignore[attr-defined]
    stmt._dycl_deep = tuple(sorted(set(owned) & deep))  # type: ignore[attr-defined]
    return [stmt]


def deep_updates(body: list[ast.stmt]) -> set[str]:
    """Names whose elements `body` may update in place (`Access.deep`), constructs converted
    inside it included."""
    names = set(block_access(body).deep)
    for node in (n for s in body for n in ast.walk(s)):
        if isinstance(node, ast.FunctionDef) and getattr(node, "_dycl_generated", False) and node.body:
            names |= set(getattr(node.body[0], "_dycl_deep", ()))
    return names


def check_body(body: list[ast.stmt], what: str, ctx_src) -> None:
    """Statements that cannot move into a generated function."""
    from dycl_jax.errors import DyclError

    stack = list(body)
    while stack:
        s = stack.pop()
        if isinstance(s, (ast.Yield, ast.YieldFrom, ast.Await)):
            raise DyclError(f"a generator or coroutine cannot be converted ({what})",
                            location=ctx_src.location(s.lineno), fix="return a tensor instead of yielding")
        if not is_scope(s):
            stack.extend(ast.iter_child_nodes(s))
