"""What a branch or loop body function takes and returns, from liveness."""
from __future__ import annotations

import ast
from dataclasses import dataclass

from dycl_jax.analysis.cfg import Liveness
from dycl_jax.analysis.scopes import block_access, free_names
from dycl_jax.rewrite.templates import is_scope, locate, name, op_call, set_name


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
    return Liveness(scope, closure_reads(scope))


def signature(live: Liveness, bodies: list[list[ast.stmt]], live_after: set[str]) -> Signature:
    """Outputs: assigned in some body and live after; inputs: read before assigned, plus outputs."""
    accs = [block_access(b) for b in bodies]
    writes = set().union(*(a.writes for a in accs)) & live.locals
    outputs = sorted(writes & live_after)
    reads: set[str] = set()
    for body, acc in zip(bodies, accs):
        reads |= live.entry(body) & (acc.reads | acc.mutates)
    inputs = sorted((reads | set(outputs)) & live.locals)
    owned = [(acc.mutates | nested_owned(body)) & set(inputs) for body, acc in zip(bodies, accs)]
    return Signature(inputs, outputs, owned)


def nested_owned(body: list[ast.stmt]) -> set[str]:
    """Names that a construct already converted inside `body` updates in place: its generated
    functions begin with `n = own(n)` for them, and take them under the same names. The
    enclosing construct updates them too (so it copies them, or refuses a live alias)."""
    names: set[str] = set()
    for node in (n for s in body for n in ast.walk(s)):
        if isinstance(node, ast.FunctionDef) and getattr(node, "_dycl_generated", False):
            for st in node.body:
                if not (isinstance(st, ast.Assign) and isinstance(st.value, ast.Call)
                        and isinstance(st.value.func, ast.Attribute) and st.value.func.attr == "own"):
                    break
                names |= {t.id for t in st.targets if isinstance(t, ast.Name)}
    return names


def kept_aliases(live: Liveness, bodies: list[list[ast.stmt]], outputs: list[str], after: set[str],
                 always_unchanged: bool = False) -> tuple[tuple[str, str], ...]:
    """Pairs (n, m) of `Site.kept_aliases`: n an output that some body does not rebind (or every
    output, for a loop that may not run), m live after the construct, and a statement of the
    function that updates one of them in place while the other is live after it."""
    binds = [block_access(b).binds for b in bodies]
    unchanged = [n for n in outputs if always_unchanged or any(n not in b for b in binds)]
    if not unchanged:
        return ()
    hazards: set[frozenset] = set()
    for node in live.cfg.nodes:
        for n in node.acc.mutates & live.locals:
            live_out = set().union(*(s.live_in for s in node.succ)) if node.succ else set()
            hazards |= {frozenset((n, m)) for m in live_out - {n}}
    return tuple(sorted((n, m) for n in unchanged for m in after & live.locals
                        if m != n and not m.startswith("_dycl_") and frozenset((n, m)) in hazards))


def own_prefix(names: set[str], at: ast.AST) -> list[ast.stmt]:
    """`x = _dycl_ops.own(x)` for inputs a body updates in place."""
    return [locate(set_name(n, op_call("own", name(n))), at) for n in sorted(names)]


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
