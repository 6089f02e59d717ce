"""Host reads (dispatch rewrite only): `n = expr.tolist()` and `n = expr.item()`, bare or under
`int`/`float`/`bool`, become `_dycl_read_k = expr` then `n = _dycl_read_k.tolist()`.

Such a statement gives a Python value computed from tensor data, so torch.export cannot hold it
and the dispatch host runs it on the host; split, the tensor work `expr` joins the compiled region
around it and only the read itself is left, which the host does with numpy on the array
(host/reads.py) instead of running the statement op by op. The order of evaluation is Python's:
`expr` is the only thing the statement evaluates before the read (the wrapper is a builtin name).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from dycl_jax.rewrite.templates import Context, locate, name, set_name

_METHODS = frozenset({"tolist", "item"})
READ_TEMP = "_dycl_read_"  # the temps' names begin so (Context.fresh("read"))
_WRAPPERS = frozenset({"int", "float", "bool"})
# inside `expr`, nodes whose hoisting could change what the statement means
_KEEP = (ast.Lambda, ast.NamedExpr, ast.Yield, ast.YieldFrom, ast.Await, ast.ListComp, ast.SetComp,
         ast.DictComp, ast.GeneratorExp)


@dataclass(frozen=True)
class ReadForm:
    """`target = wrapper(source.method())`: what the host reads, of which name, how."""

    source: str
    method: str  # "tolist" or "item"
    wrapper: str = ""  # "", "int", "float" or "bool"


def _read_call(value: ast.expr) -> tuple[ast.Call, str] | None:
    """(the `.tolist()`/`.item()` call, its wrapper) where `value` is one, bare or wrapped."""
    wrapper = ""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in _WRAPPERS \
            and len(value.args) == 1 and not value.keywords:
        wrapper, value = value.func.id, value.args[0]
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _METHODS \
            and not value.args and not value.keywords:
        return value, wrapper
    return None


def read_form(s: ast.stmt) -> ReadForm | None:
    """The read a statement is, where it is exactly `name = [wrapper](source.method())`."""
    if not (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)):
        return None
    found = _read_call(s.value)
    if found is None or not isinstance(found[0].func.value, ast.Name):  # type: ignore[attr-defined]
        return None
    call, wrapper = found
    return ReadForm(call.func.value.id, call.func.attr, wrapper)  # type: ignore[attr-defined]


def _hoisted(s: ast.stmt, ctx: Context) -> list[ast.stmt] | None:
    """`[temp = expr, s reading temp]` for a read statement of a computed expression, else None."""
    if not (isinstance(s, ast.Assign) and len(s.targets) == 1):
        return None
    found = _read_call(s.value)
    if found is None:
        return None
    receiver = found[0].func.value  # type: ignore[attr-defined]
    if isinstance(receiver, ast.Name) or any(isinstance(n, _KEEP) for n in ast.walk(receiver)):
        return None
    temp = ctx.fresh("read")
    found[0].func.value = locate(name(temp), receiver)  # type: ignore[attr-defined]
    return [locate(set_name(temp, receiver), s), s]


class _Hoist(ast.NodeTransformer):
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        return node  # nested functions run as written

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        return node

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field, value in ast.iter_fields(node):
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                out: list[ast.stmt] = []
                for s in value:
                    s = self.visit(s)
                    out += _hoisted(s, self.ctx) or [s]
                setattr(node, field, out)
        return node


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    if scope is not ctx.src.tree:
        return  # as dispatch_split: nested user functions run as written
    hoist, body = _Hoist(ctx), []
    for s in scope.body:
        s = hoist.visit(s)
        body += _hoisted(s, ctx) or [s]
    scope.body = body
