"""Row selections written as masked dense computations (runtime: rewrite/rows.py):

    sel = M.nonzero(as_tuple=True)[0]     sel = _dycl_ops.rows.select(M, lambda m: m.nonzero(as_tuple=True)[0], F, L)
    if sel.numel() == 0:              →   if _dycl_ops.rows.empty(sel):
        continue                              continue
    out[sel] = f(x[sel], w[sel, None])    out = _dycl_ops.rows.put(out, sel, f(_dycl_ops.rows.take(sel, x), ...))

and `out[m] = f(x[m])` (a boolean mask `m`) likewise. Only where the rewrite cannot change what
the code means: `sel` is read nowhere else; the statements an emptiness test skips are only
writes to `sel`'s rows; `out` is a tensor the function itself creates (zeros_like, clone, ...)
and nothing reads it (no alias can see the in-place writes) until the last write's statement
ends. Whether `f` is row-wise is proved on the captured graph (capture/bounded_rows.py).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from dycl_jax.rewrite.templates import OPS, Context, const, lambda_, locate, name, own_statements, set_name

# calls that return a new tensor: writes into it are seen by no other name
_FRESH_TORCH = {"zeros", "zeros_like", "ones", "ones_like", "full", "full_like"}
_FRESH_METHODS = {"clone", "new_zeros", "new_ones", "new_full"}


def _rows_call(fn: str, *args: ast.expr) -> ast.Call:
    func = ast.Attribute(value=ast.Attribute(value=name(OPS), attr="rows", ctx=ast.Load()), attr=fn, ctx=ast.Load())
    return ast.Call(func=func, args=list(args), keywords=[])


def _is_torch(node: ast.expr, attr: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name) \
        and node.value.id == "torch"


def _selection(value: ast.expr) -> tuple[ast.expr, ast.expr] | None:
    """(M, the expression with M replaced by a parameter) for `M.nonzero(as_tuple=True)[0]`,
    `torch.nonzero(M, as_tuple=True)[0]` and `torch.where(M)[0]`."""
    if not (isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant) and value.slice.value == 0
            and isinstance(value.value, ast.Call)):
        return None
    call = value.value
    as_tuple = len(call.keywords) == 1 and call.keywords[0].arg == "as_tuple" \
        and isinstance(call.keywords[0].value, ast.Constant) and call.keywords[0].value.value is True
    param = name("_dycl_m")
    if isinstance(call.func, ast.Attribute) and call.func.attr == "nonzero" and not _is_torch(call.func, "nonzero") \
            and not call.args and as_tuple:
        m = call.func.value
        new = ast.Call(func=ast.Attribute(value=param, attr="nonzero", ctx=ast.Load()), args=[], keywords=call.keywords)
    elif _is_torch(call.func, "nonzero") and len(call.args) == 1 and as_tuple:
        m = call.args[0]
        new = ast.Call(func=call.func, args=[param], keywords=call.keywords)
    elif _is_torch(call.func, "where") and len(call.args) == 1 and not call.keywords:
        m = call.args[0]
        new = ast.Call(func=call.func, args=[param], keywords=[])
    else:
        return None
    return m, ast.Subscript(value=new, slice=const(0), ctx=ast.Load())


def _empty_test(test: ast.expr, sel: str) -> bool:
    """`sel.numel() == 0`, `len(sel) == 0`, `sel.shape[0] == 0`, `sel.size(0) == 0`, `not sel.numel()`, `not len(sel)`."""
    def count(e: ast.expr) -> bool:
        if isinstance(e, ast.Call) and not e.keywords:
            f = e.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == sel:
                return (f.attr == "numel" and not e.args) or (f.attr == "size" and len(e.args) == 1
                                                            and isinstance(e.args[0], ast.Constant)
                                                            and e.args[0].value == 0)
            return isinstance(f, ast.Name) and f.id == "len" and len(e.args) == 1 \
                and isinstance(e.args[0], ast.Name) and e.args[0].id == sel
        return isinstance(e, ast.Subscript) and isinstance(e.value, ast.Attribute) and e.value.attr == "shape" \
            and isinstance(e.value.value, ast.Name) and e.value.value.id == sel \
            and isinstance(e.slice, ast.Constant) and e.slice.value == 0
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return count(test.operand)
    return isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq) \
        and count(test.left) and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == 0


def _is_key(node: ast.expr, key: str) -> bool:
    return isinstance(node, ast.Name) and node.id == key


def _takes(expr: ast.expr, key: str) -> list[ast.Subscript] | None:
    """The `x[key]` / `x[key, ...]` reads in `expr`, or None where `key` is read any other way."""
    found: list[ast.Subscript] = []
    allowed: set[int] = set()
    for node in ast.walk(expr):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            s = node.slice
            first = s.elts[0] if isinstance(s, ast.Tuple) and s.elts else s
            if _is_key(first, key):
                rest = s.elts[1:] if isinstance(s, ast.Tuple) else []
                if any(_is_key(n, key) for r in rest for n in ast.walk(r)) \
                        or any(_is_key(n, key) for n in ast.walk(node.value)):
                    return None
                found.append(node)
                allowed.add(id(first))
    if any(_is_key(n, key) and id(n) not in allowed for n in ast.walk(expr)):
        return None
    return found


def _put(s: ast.stmt, key: str) -> tuple[str, list[ast.Subscript]] | None:
    """(out, the reads of the selection) for `out[key] = EXPR` reading `key` only as `x[key, ...]`."""
    if not (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Subscript)):
        return None
    t = s.targets[0]
    if not (isinstance(t.value, ast.Name) and _is_key(t.slice, key)):
        return None
    takes = _takes(s.value, key)
    return (t.value.id, takes) if takes is not None else None


def _slice_expr(e: ast.expr) -> ast.expr:
    if isinstance(e, ast.Slice):
        parts = [p if p is not None else const(None) for p in (e.lower, e.upper, e.step)]
        return ast.Call(func=name("slice"), args=parts, keywords=[])
    return e


def _take_call(node: ast.Subscript, rows: str) -> ast.Call:
    rest = node.slice.elts[1:] if isinstance(node.slice, ast.Tuple) else []
    return _rows_call("take", name(rows), node.value, *[_slice_expr(r) for r in rest])


class _Takes(ast.NodeTransformer):
    def __init__(self, takes: list[ast.Subscript], rows: str) -> None:
        self.ids = {id(t) for t in takes}
        self.rows = rows

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        if id(node) in self.ids:
            return locate(ast.copy_location(_take_call(node, self.rows), node), node)
        self.generic_visit(node)
        return node


def _rewrite_put(s: ast.Assign, out: str, takes: list[ast.Subscript], rows: str) -> ast.stmt:
    value = _Takes(takes, rows).visit(s.value)
    return locate(ast.copy_location(set_name(out, _rows_call("put", name(out), name(rows), value)), s), s)


def _loads(node: ast.AST, var: str) -> list[ast.Name]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == var and isinstance(n.ctx, ast.Load)]


def _stores(scope: ast.AST, var: str) -> int:
    return sum(1 for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == var and not isinstance(n.ctx, ast.Load))


def _fresh(value: ast.expr) -> bool:
    if not isinstance(value, ast.Call):
        return False
    f = value.func
    if not isinstance(f, ast.Attribute):
        return False
    return _is_torch(f, f.attr) if f.attr in _FRESH_TORCH else f.attr in _FRESH_METHODS


def _contains(stmt: ast.stmt, node: ast.AST) -> bool:
    return any(n is node for n in ast.walk(stmt))


@dataclass
class _Plan:
    puts: list[tuple[ast.Assign, str, list[ast.Subscript], str]] = field(default_factory=list)  # stmt, out, takes, rows
    replace: dict[int, list[ast.stmt]] = field(default_factory=dict)  # id(stmt) -> its replacement


def _owned(scope: ast.FunctionDef, out: str, puts: list[ast.Assign]) -> bool:
    """`out` is created once in the scope by a fresh-tensor call, and between that statement and
    the end of the statement holding the last write nothing reads it except the writes' targets."""
    if _stores(scope, out) != 1 or out in {a.arg for a in ast.walk(scope.args) if isinstance(a, ast.arg)}:
        return False
    for s, block in own_statements(scope):
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and _is_key(s.targets[0], out):
            if not _fresh(s.value):
                return False
            i = block.index(s)
            holders = [k for k in range(i + 1, len(block)) if any(_contains(block[k], p) for p in puts)]
            if {id(p) for p in puts} - {id(p) for k in holders for p in puts if _contains(block[k], p)}:
                return False  # a write outside the creation's block
            targets = {id(p.targets[0].value) for p in puts}
            return all(id(n) in targets for k in range(i + 1, max(holders) + 1) for n in _loads(block[k], out))
    return False


def _plan_selections(scope: ast.FunctionDef, ctx: Context, plan: _Plan) -> None:
    for s, block in own_statements(scope):
        if not (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)):
            continue
        found = _selection(s.value)
        sel = s.targets[0].id
        if found is None or _stores(scope, sel) != 1:
            continue
        i = block.index(s)
        puts, check, ok = [], None, True
        for k in range(i + 1, len(block)):
            t = block[k]
            p = _put(t, sel)
            if p is not None:
                puts.append((t, *p))
            elif isinstance(t, ast.If) and _empty_test(t.test, sel) and not t.orelse \
                    and len(t.body) == 1 and isinstance(t.body[0], ast.Continue) and check is None:
                check = t
            elif _loads(t, sel):
                ok = False
        # reads of `sel` outside this block (in statements before it, or outer ones) stop the rewrite
        reads = sum(len(_loads(t, sel)) for t in block[i + 1:])
        ok = ok and bool(puts) and reads == len(_loads(scope, sel))
        if check is not None:  # what the test skips must be writes to sel's rows only
            ok = ok and all(any(t is p[0] for p in puts) for t in block[block.index(check) + 1:])
        if not ok or not all(_owned(scope, out, [q[0] for q in puts if q[1] == out]) for _, out, _ in puts):
            continue
        m, original = found
        where = [const(ctx.src.file), const(s.lineno)]
        call = _rows_call("select", m, lambda_(["_dycl_m"], original), *where)
        plan.replace[id(s)] = [locate(ast.copy_location(set_name(sel, call), s), s)]
        if check is not None:
            test = locate(ast.copy_location(_rows_call("empty", name(sel)), check.test), check.test)
            plan.replace[id(check)] = [ast.copy_location(ast.If(test=test, body=check.body, orelse=[]), check)]
        plan.puts += [(t, out, takes, sel) for t, out, takes in puts]


def _plan_masks(scope: ast.FunctionDef, ctx: Context, plan: _Plan) -> None:
    """`out[m] = f(x[m])` with a Name `m`: the runtime decides on its value (a 1-D bool mask or not)."""
    done = {id(p[0]) for p in plan.puts}
    for s, block in own_statements(scope):
        if id(s) in done or not (isinstance(s, ast.Assign) and len(s.targets) == 1
                                 and isinstance(s.targets[0], ast.Subscript)
                                 and isinstance(s.targets[0].slice, ast.Name)):
            continue
        key = s.targets[0].slice.id
        p = _put(s, key)
        if p is None or not p[1] or not _owned(scope, p[0], [s]):
            continue
        rows = ctx.fresh("rows")
        head = locate(ast.copy_location(set_name(rows, _rows_call("of_mask", name(key), const(ctx.src.file),
                                                                  const(s.lineno))), s), s)
        plan.replace[id(s)] = [head, _rewrite_put(s, p[0], p[1], rows)]


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    plan = _Plan()
    _plan_selections(scope, ctx, plan)
    for s, out, takes, rows in plan.puts:
        plan.replace[id(s)] = [_rewrite_put(s, out, takes, rows)]
    _plan_masks(scope, ctx, plan)
    if not plan.replace:
        return

    def apply(block: list[ast.stmt]) -> list[ast.stmt]:
        new: list[ast.stmt] = []
        for s in block:
            if id(s) in plan.replace:
                new += plan.replace[id(s)]
                continue
            if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for field_name in ("body", "orelse", "finalbody"):
                    part = getattr(s, field_name, None)
                    if isinstance(part, list) and part and isinstance(part[0], ast.stmt):
                        setattr(s, field_name, apply(part))
                for h in getattr(s, "handlers", []) or []:
                    h.body = apply(h.body)
            new.append(s)
        return new

    scope.body = apply(scope.body)
