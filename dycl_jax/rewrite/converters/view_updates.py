"""Views re-derived after a construct that updates their base in place (`a = v[0]`, then `v.add_(1)` in a branch)."""
from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

from dycl_jax.analysis.aliases import _VIEWS
from dycl_jax.analysis.scopes import access, block_access
from dycl_jax.rewrite.appends import rebound
from dycl_jax.rewrite.templates import OPS, lambda_, locate, name, op_call, set_name

# view methods whose result is a view of (or the very) tensor they are called on, or a copy:
# never a tuple of views (`split`, `chunk`, `unbind`: an element refusal stays) nor a new dtype
_ONE_VIEW = _VIEWS - {"split", "chunk", "unbind", "requires_grad_", "type_as", "to"}
_ATTR_VIEWS = frozenset({"T", "mT", "H", "mH"})
# an operand of a view expression re-run later gives the same value when no name it reads changed
_OPERANDS = (ast.Name, ast.Constant, ast.Slice, ast.Tuple, ast.UnaryOp, ast.BinOp, ast.unaryop, ast.operator,
             ast.expr_context)


@dataclass(frozen=True)
class Rederived:
    """`view = expr` (a view of `base`) holds before the construct: after it, `expr` is run again on
    the construct's new `base`, where `view` was a view of `base` when the construct began."""

    view: str
    base: str
    expr: ast.expr


def base_of(expr: ast.expr) -> str | None:
    """The name `expr` views through a chain of basic indexing and view methods (`v[0]`, `v[:, 1].t()`,
    `v.view(2, 3)`, `v.T`); None where any operand could change when run again (a call, an attribute)."""
    e = expr
    while True:
        if isinstance(e, ast.Subscript) and _plain(e.slice):
            e = e.value
        elif isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr in _ONE_VIEW \
                and all(_plain(a) for a in e.args) and all(k.arg is not None and _plain(k.value) for k in e.keywords):
            e = e.func.value
        elif isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "getitem" \
                and isinstance(e.func.value, ast.Name) and e.func.value.id == OPS and len(e.args) == 2 \
                and not e.keywords and _plain(e.args[1]):
            e = e.args[0]  # `v[i]` with a name index, as converters/host_values.py writes it
        elif isinstance(e, ast.Attribute) and e.attr in _ATTR_VIEWS:
            e = e.value
        else:
            break
    return e.id if isinstance(e, ast.Name) and e is not expr else None


def _plain(operand: ast.AST) -> bool:
    return all(isinstance(n, _OPERANDS) for n in ast.walk(operand))


def _definition(stmt: ast.stmt, view: str) -> tuple[str, ast.expr] | None:
    """(base, expr) where `stmt` is `view = expr` with `expr` a view expression (or a re-derivation)."""
    kept = getattr(stmt, "_dycl_rederives", None)
    if kept is not None:
        return (kept.base, kept.expr) if kept.view == view else None
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
            and stmt.targets[0].id == view:
        base = base_of(stmt.value)
        if base is not None and base != view:
            return base, stmt.value
    return None


def _user_refs(nodes: list[ast.AST]) -> set[str]:
    """Names read or bound in `nodes`, leaving out the statements this module generates."""
    found: set[str] = set()
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if getattr(n, "_dycl_rederives", None) is not None or getattr(n, "_dycl_view_test", False):
            continue
        if isinstance(n, ast.Name):
            found.add(n.id)
        stack.extend(ast.iter_child_nodes(n))
    return found


def find(node: ast.stmt, block: list[ast.stmt], owned: set[str], live_after: set[str]) -> list[Rederived]:
    """Names read after `node` that a statement earlier in `block` made a view of a tensor the
    construct updates in place, where running that view expression again after the construct is
    what torch's view shows: no statement between (nor the construct) rebinds the view, its base or
    anything the expression reads, or updates an operand in place, and the construct never reads or
    binds the view (it sees the update only after the construct). The rest stay refused (operators)."""
    if not owned or (isinstance(node, ast.While) and node.orelse):
        return []
    i = next(k for k, s in enumerate(block) if s is node)
    inside = _user_refs([node])
    changed_inside = rebound([node])
    found = []
    for view in sorted(live_after - owned - inside):
        for j in range(i - 1, -1, -1):
            stmt = block[j]
            if view not in block_access([stmt]).binds:
                continue
            defined = _definition(stmt, view)
            if defined is None:
                break
            base, expr = defined
            operands = access(expr).reads - {base}
            between = block[j + 1:i]
            touched = block_access(between)
            if base in owned and base not in changed_inside and not (operands & changed_inside) \
                    and not ({view, base} & rebound(between)) and not (operands & touched.writes) \
                    and not (operands & block_access([node]).mutates):
                found.append(Rederived(view, base, expr))
            break
    return found


def wrap(construct: list[ast.stmt], found: list[Rederived], fresh, at: ast.AST) -> list[ast.stmt]:
    """`construct` (the statements that replace it) between, per view, a test of whether the view
    shares its base's memory now (a copy made by `v[mask]` or `reshape` does not, and keeps its
    value) and its re-derivation from the construct's new base."""
    before, after = [], []
    for r in found:
        flag = fresh("view")
        test = locate(set_name(flag, op_call("is_view", name(r.view), name(r.base))), at)
        test._dycl_view_test = True  # type: ignore[attr-defined]
        again = locate(set_name(r.view, op_call("view_again", name(flag), name(r.view),
                                                lambda_([], copy.deepcopy(r.expr)))), at)
        again._dycl_rederives = r  # type: ignore[attr-defined]
        before.append(test)
        after.append(again)
    return [*before, *construct, *after]
