"""Host reads (dispatch rewrite only): `n = expr.tolist()`, `n = expr.item()` (bare or under
`int`/`float`/`bool`), `sel = expr.nonzero()` and `sel = expr.nonzero(as_tuple=True)[k]` (or
`torch.nonzero(expr)`, `torch.nonzero(expr, as_tuple=True)[k]`, `torch.where(expr)[k]`) become
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

import torch

from dycl_jax.analysis.scopes import function_locals, param_names
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


def _function_call(value: ast.expr, torch_names: frozenset[str]) -> ast.Call | None:
    """`torch.nonzero(x, ...)` or `torch.where(x)`: one positional argument, `torch` a name the
    function's globals bind to the torch module (`torch_names`)."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and isinstance(value.func.value, ast.Name) and value.func.value.id in torch_names \
            and value.func.attr in ("nonzero", "where") and len(value.args) == 1 \
            and not isinstance(value.args[0], ast.Starred):
        return value
    return None


def _as_tuple(call: ast.Call) -> bool:
    """`torch.where(x)`, or a nonzero call whose only keyword is `as_tuple=True`."""
    if call.func.attr == "where":  # type: ignore[attr-defined]
        return not call.keywords
    return len(call.keywords) == 1 and call.keywords[0].arg == "as_tuple" \
        and isinstance(call.keywords[0].value, ast.Constant) and call.keywords[0].value.value is True


def receiver(call: ast.Call) -> ast.expr:
    """What a read call reads: the object of `x.nonzero()`, the argument of `torch.nonzero(x)`."""
    return call.args[0] if call.args else call.func.value  # type: ignore[attr-defined]


def _read_call(value: ast.expr, torch_names: frozenset[str] = frozenset()) -> tuple[ast.Call, str, int | None] | None:
    """(the reading call, its wrapper, its tuple index) where `value` is a read."""
    if isinstance(value, ast.Subscript):  # x.nonzero(as_tuple=True)[k], torch.where(x)[k]
        k = _int(value.slice)
        call = _method_call(value.value, _NONZERO) or _function_call(value.value, torch_names)
        return (call, "", k) if k is not None and call is not None and _as_tuple(call) else None
    call = _method_call(value, _NONZERO) or _function_call(value, torch_names)
    if call is not None:
        return (call, "", None) if not call.keywords and call.func.attr == "nonzero" else None  # type: ignore[attr-defined]
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


def torch_names(ctx: Context) -> frozenset[str]:
    """Names the converted function's globals bind to the torch module, and it does not rebind."""
    local = function_locals(ctx.src.tree) | param_names(ctx.src.tree)
    return frozenset(n for n, v in ctx.src.fn.__globals__.items() if v is torch and n not in local)


def read_form(s: ast.stmt, torch_names: frozenset[str] = frozenset()) -> ReadForm | None:
    """The read a statement is, where it is exactly `name = <read of a name>` or `name = a[m]`."""
    if not (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)):
        return None
    if isinstance(s.value, ast.Subscript) and isinstance(s.value.value, ast.Name) \
            and isinstance(s.value.slice, ast.Name):
        return ReadForm(s.value.value.id, "mask", mask=s.value.slice.id)
    found = _read_call(s.value, torch_names)
    if found is None or not isinstance(receiver(found[0]), ast.Name):
        return None
    call, wrapper, index = found
    method = "nonzero" if call.func.attr == "where" else call.func.attr  # type: ignore[attr-defined]
    return ReadForm(receiver(call).id, method, wrapper, index)  # type: ignore[attr-defined]


def _hoisted(s: ast.stmt, ctx: Context, torch_names: frozenset[str]) -> list[ast.stmt] | None:
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
    found = _read_call(s.value, torch_names)
    if found is None:
        return None
    read = receiver(found[0])
    if isinstance(read, ast.Name) or any(isinstance(n, _KEEP) for n in ast.walk(read)):
        return None
    temp = ctx.fresh("read")
    if found[0].args:  # torch.nonzero(expr)
        found[0].args[0] = locate(name(temp), read)
    else:
        found[0].func.value = locate(name(temp), read)  # type: ignore[attr-defined]
    return [locate(set_name(temp, read), s), s]


class _Hoist(ast.NodeTransformer):
    """Hoists the reads of every statement list, nested blocks included, but not inside nested
    functions and lambdas (they run as written)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.torch_names = torch_names(ctx)

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
                    out += _hoisted(s, self.ctx, self.torch_names) or [s]
                setattr(node, field, out)
        return node


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    if scope is ctx.src.tree:  # as dispatch_split: nested user functions run as written
        _Hoist(ctx).generic_visit(scope)
