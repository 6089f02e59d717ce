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
    owned = [acc.mutates & set(inputs) for acc in accs]
    return Signature(inputs, outputs, owned)


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
