"""Host reads (dispatch rewrite only): `n = expr.tolist()`, `n = expr.item()` (bare or under
`int`/`float`/`bool`), `sel = expr.nonzero()` and `sel = expr.nonzero(as_tuple=True)[k]` become
`_dycl_read_k = expr` then the same read of `_dycl_read_k`; `y = a[m]` with a mask expression
`m` (`x > 0`, `~keep`, `a & b`) becomes temps for `a` and `m` then `y = temp_a[temp_m]`.

Such a statement gives a Python value, or an array whose size depends on the data, so torch.export
cannot hold it and the dispatch host runs it on the host; split, the tensor work `expr` joins the
compiled region around it and only the read itself is left, which the host does with numpy on the
array (host/reads.py) instead of running the statement op by op. The order of evaluation is
Python's: `expr` is the only thing the statement evaluates before the read (the wrapper is a
builtin name, the index a constant).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from dycl_jax.rewrite.templates import Context, locate, name, set_name

_METHODS = frozenset({"tolist", "item"})
_NONZERO = frozenset({"nonzero"})
_WRAPPERS = frozenset({"int", "float", "bool"})
READ_TEMP = "_dycl_read_"  # the temps' names begin so (Context.fresh("read"))
# inside `expr`, nodes whose hoisting could change what the statement means
_KEEP = (ast.Lambda, ast.NamedExpr, ast.Yield, ast.YieldFrom, ast.Await, ast.ListComp, ast.SetComp,
         ast.DictComp, ast.GeneratorExp)


@dataclass(frozen=True)
class ReadForm:
    """`target = wrapper(source.method())`, `target = source.nonzero(as_tuple=True)[index]` or
    `target = source[mask]`: what the host reads, of which names, how."""

    source: str
    method: str  # "tolist", "item", "nonzero" or "mask" (`source[mask]`)
    wrapper: str = ""  # "", "int", "float" or "bool"
    index: int | None = None  # nonzero(as_tuple=True)[index]; None: nonzero() itself
    mask: str = ""  # the name indexing `source` (a bool array at run time, else no read)


def _method_call(value: ast.expr, methods: frozenset[str]) -> ast.Call | None:
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in methods \
            and not value.args:
        return value
    return None


def _int(node: ast.expr) -> int | None:
    """The int constant `node` is (`0`, `-1`), else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        k = _int(node.operand)
        return None if k is None else -k
    return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None


def _read_call(value: ast.expr) -> tuple[ast.Call, str, int | None] | None:
    """(the reading method call, its wrapper, its tuple index) where `value` is a read."""
    if isinstance(value, ast.Subscript):  # x.nonzero(as_tuple=True)[k]
        k = _int(value.slice)
        call = _method_call(value.value, _NONZERO)
        if k is not None and call is not None and len(call.keywords) == 1 and call.keywords[0].arg == "as_tuple" \
                and isinstance(call.keywords[0].value, ast.Constant) and call.keywords[0].value.value is True:
            return call, "", k
        return None
    call = _method_call(value, _NONZERO)
    if call is not None:
        return (call, "", None) if not call.keywords else None
    wrapper = ""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in _WRAPPERS \
            and len(value.args) == 1 and not value.keywords:
        wrapper, value = value.func.id, value.args[0]
    call = _method_call(value, _METHODS)
    return (call, wrapper, None) if call is not None and not call.keywords else None


def _masky(node: ast.expr) -> bool:
    """An index expression that gives a bool mask when its operands are tensors: `x > 0`, `~m`, `a & b`."""
    return isinstance(node, ast.Compare) or isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert) \
        or isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr, ast.BitXor))


def read_form(s: ast.stmt) -> ReadForm | None:
    """The read a statement is, where it is exactly `name = <read of a name>` or `name = a[m]`."""
    if not (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)):
        return None
    if isinstance(s.value, ast.Subscript) and isinstance(s.value.value, ast.Name) \
            and isinstance(s.value.slice, ast.Name):
        return ReadForm(s.value.value.id, "mask", mask=s.value.slice.id)
    found = _read_call(s.value)
    if found is None or not isinstance(found[0].func.value, ast.Name):  # type: ignore[attr-defined]
        return None
    call, wrapper, index = found
    return ReadForm(call.func.value.id, call.func.attr, wrapper, index)  # type: ignore[attr-defined]


def _hoisted(s: ast.stmt, ctx: Context) -> list[ast.stmt] | None:
    """`[temp = expr, s reading temp]` for a read statement of a computed expression, else None."""
    if not (isinstance(s, ast.Assign) and len(s.targets) == 1):
        return None
    if isinstance(s.value, ast.Subscript) and _masky(s.value.slice) \
            and not any(isinstance(n, _KEEP) for n in ast.walk(s.value)):
        # `y = f(x)[x > 0]`: Python evaluates the indexed value, then the index; so do the temps
        out = []
        for field in ("value", "slice"):
            part = getattr(s.value, field)
            if not isinstance(part, ast.Name):
                temp = ctx.fresh("read")
                out.append(locate(set_name(temp, part), s))
                setattr(s.value, field, locate(name(temp), part))
        return out + [s]
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
    """Hoists the reads of every statement list, nested blocks included, but not inside nested
    functions and lambdas (they run as written)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        return node

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
    if scope is ctx.src.tree:  # as dispatch_split: nested user functions run as written
        _Hoist(ctx).generic_visit(scope)
