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

The same routing written `out[sel] += v` (any of `+= -= *= /=`), `out.index_add_(0, sel, v)`, or
with the writes inside `if sel.numel() > 0:` (`len(sel)`, `sel.shape[0] != 0`, ...) instead of a
`continue`, takes the same form: `rows.accumulate`, `rows.index_add` and `rows.nonempty`. An
accumulating write equals `out = where(m, out OP v, out)` only because the selected rows are
distinct (the runtime takes the dense form only for a 1-D mask or the `nonzero` of one).
"""
from __future__ import annotations

import ast
import dis
import types
from dataclasses import dataclass, field

from dycl_jax.rewrite.templates import OPS, Context, const, lambda_, locate, name, own_statements, set_name, user_scopes

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


def _count(e: ast.expr, sel: str) -> bool:
    """`sel.numel()`, `len(sel)`, `sel.shape[0]`, `sel.size(0)`: the number of selected rows."""
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


# count OP k: which (op, k) say "no rows" and which "some rows" (the count is an int >= 0)
_EMPTY = {(ast.Eq, 0), (ast.Lt, 1), (ast.LtE, 0)}
_NONEMPTY = {(ast.NotEq, 0), (ast.Gt, 0), (ast.GtE, 1)}


def _count_test(test: ast.expr, sel: str, empty: bool) -> bool:
    """`test` says the selection is empty (`empty`) or that it is not, e.g. `sel.numel() == 0`,
    `not len(sel)` / `sel.numel() > 0`, `len(sel)`, `sel.shape[0] != 0`."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _count_test(test.operand, sel, not empty)
    if _count(test, sel):
        return not empty
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and _count(test.left, sel)
            and isinstance(test.comparators[0], ast.Constant) and type(test.comparators[0].value) is int):
        return False
    return (type(test.ops[0]), test.comparators[0].value) in (_EMPTY if empty else _NONEMPTY)


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


# `out[key] OP= v` as the out-of-place operator it stands for (rows.accumulate)
_AUG = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}


@dataclass
class _Write:
    """A write of the selection's rows: `out[key] = value` (op None), `out[key] OP= value`
    (op "add", ...), or `out.index_add_(0, key, value)` (op "index_add")."""

    stmt: ast.stmt
    out: str
    target: ast.Name  # the `out` the statement writes through
    value: ast.expr
    takes: list[ast.Subscript]
    op: str | None


def _write(s: ast.stmt, key: str, index_add: bool = True) -> _Write | None:
    """The write `s` makes to `key`'s rows, reading `key` elsewhere only as `x[key, ...]`."""
    if isinstance(s, ast.Assign) and len(s.targets) == 1:
        t, value, op = s.targets[0], s.value, None
    elif isinstance(s, ast.AugAssign) and type(s.op) in _AUG:
        t, value, op = s.target, s.value, _AUG[type(s.op)]
    elif index_add and isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) \
            and isinstance(s.value.func, ast.Attribute) and s.value.func.attr == "index_add_" \
            and isinstance(s.value.func.value, ast.Name) and not s.value.keywords and len(s.value.args) == 3 \
            and isinstance(s.value.args[0], ast.Constant) and type(s.value.args[0].value) is int \
            and s.value.args[0].value == 0 and _is_key(s.value.args[1], key):
        out, value = s.value.func.value, s.value.args[2]
        takes = _takes(value, key)
        return _Write(s, out.id, out, value, takes, "index_add") if takes is not None else None
    else:
        return None
    if not (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and _is_key(t.slice, key)):
        return None
    takes = _takes(value, key)
    return _Write(s, t.value.id, t.value, value, takes, op) if takes is not None else None


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


def _rewrite_write(w: _Write, rows: str) -> ast.stmt:
    value = _Takes(w.takes, rows).visit(w.value)
    if w.op is None:
        call = _rows_call("put", name(w.out), name(rows), value)
    elif w.op == "index_add":
        call = _rows_call("index_add", name(w.out), name(rows), value)
    else:
        call = _rows_call("accumulate", name(w.out), name(rows), value, const(w.op))
    return locate(ast.copy_location(set_name(w.out, call), w.stmt), w.stmt)


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
    writes: list[tuple[_Write, str]] = field(default_factory=list)  # each write and its rows' name
    replace: dict[int, list[ast.stmt]] = field(default_factory=dict)  # id(stmt) -> its replacement


def _owned(scope: ast.FunctionDef, out: str, writes: list[_Write]) -> bool:
    """`out` is created once in the scope by a fresh-tensor call, and between that statement and
    the end of the statement holding the last write nothing reads it except the writes' targets."""
    if _stores(scope, out) != 1 or out in {a.arg for a in ast.walk(scope.args) if isinstance(a, ast.arg)}:
        return False
    puts = [w.stmt for w in writes]
    for s, block in own_statements(scope):
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and _is_key(s.targets[0], out):
            if not _fresh(s.value):
                return False
            i = block.index(s)
            holders = [k for k in range(i + 1, len(block)) if any(_contains(block[k], p) for p in puts)]
            if {id(p) for p in puts} - {id(p) for k in holders for p in puts if _contains(block[k], p)}:
                return False  # a write outside the creation's block
            targets = {id(w.target) for w in writes}
            return all(id(n) in targets for k in range(i + 1, max(holders) + 1) for n in _loads(block[k], out))
    return False


def _guarded_writes(t: ast.stmt, sel: str) -> list[_Write] | None:
    """The writes of `if <sel is not empty>: <writes of sel's rows only>`, else None."""
    if not (isinstance(t, ast.If) and not t.orelse and _count_test(t.test, sel, empty=False)):
        return None
    writes = [_write(b, sel) for b in t.body]
    return writes if all(w is not None for w in writes) else None


def _plan_selections(scope: ast.FunctionDef, ctx: Context, plan: _Plan) -> None:
    found_all: list[tuple] = []  # (statement, selection, sel, writes, emptiness test, nonempty guards)
    for s, block in own_statements(scope):
        if not (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)):
            continue
        found = _selection(s.value)
        sel = s.targets[0].id
        if found is None or _stores(scope, sel) != 1:
            continue
        i = block.index(s)
        writes: list[_Write] = []
        check, guards, ok = None, [], True
        for k in range(i + 1, len(block)):
            t = block[k]
            w = _write(t, sel)
            guarded = _guarded_writes(t, sel) if w is None else None
            if w is not None:
                writes.append(w)
            elif guarded is not None:
                writes += guarded
                guards.append(t)
            elif isinstance(t, ast.If) and _count_test(t.test, sel, empty=True) and not t.orelse \
                    and len(t.body) == 1 and isinstance(t.body[0], ast.Continue) and check is None:
                check = t
            elif _loads(t, sel):
                ok = False
        # reads of `sel` outside this block (in statements before it, or outer ones) stop the rewrite
        reads = sum(len(_loads(t, sel)) for t in block[i + 1:])
        ok = ok and bool(writes) and reads == len(_loads(scope, sel))
        if check is not None:  # what the test skips must be writes to sel's rows only
            done = {id(w.stmt) for w in writes} | {id(g) for g in guards}
            ok = ok and all(id(t) in done for t in block[block.index(check) + 1:])
        if ok:
            found_all.append((s, found, sel, writes, check, guards))
    # `out` is owned by the writes of every selection into it (two selections may share it);
    # a selection dropped for one tensor it writes leaves its other tensors' owners fewer writes
    while True:
        writes_to: dict[str, list[_Write]] = {}
        for *_, writes, _, _ in found_all:
            for w in writes:
                writes_to.setdefault(w.out, []).append(w)
        owned = {out for out, ws in writes_to.items() if _owned(scope, out, ws)}
        kept = [c for c in found_all if all(w.out in owned for w in c[3])]
        if len(kept) == len(found_all):
            break
        found_all = kept
    for s, found, sel, writes, check, guards in found_all:
        m, original = found
        where = [const(ctx.src.file), const(s.lineno)]
        call = _rows_call("select", m, lambda_(["_dycl_m"], original), *where)
        plan.replace[id(s)] = [locate(ast.copy_location(set_name(sel, call), s), s)]
        if check is not None:
            test = locate(ast.copy_location(_rows_call("empty", name(sel)), check.test), check.test)
            plan.replace[id(check)] = [ast.copy_location(ast.If(test=test, body=check.body, orelse=[]), check)]
        for g in guards:  # the writes inside are replaced when the new `if` is walked
            test = locate(ast.copy_location(_rows_call("nonempty", name(sel)), g.test), g.test)
            plan.replace[id(g)] = [ast.copy_location(ast.If(test=test, body=g.body, orelse=[]), g)]
        plan.writes += [(w, sel) for w in writes]


def _plan_masks(scope: ast.FunctionDef, ctx: Context, plan: _Plan) -> None:
    """`out[m] = f(x[m])` (or `out[m] += ...`) with a Name `m`: the runtime decides on its value
    (a 1-D bool mask or not)."""
    done = {id(w.stmt) for w, _ in plan.writes}
    for s, block in own_statements(scope):
        if id(s) in done or not (isinstance(s, (ast.Assign, ast.AugAssign))
                                 and isinstance(t := (s.targets[0] if isinstance(s, ast.Assign) else s.target),
                                                ast.Subscript)
                                 and isinstance(t.slice, ast.Name)):
            continue
        key = t.slice.id
        w = _write(s, key, index_add=False)  # index_add_ takes integer indices, never a mask
        if w is None or not w.takes or not _owned(scope, w.out, [w]):
            continue
        rows = ctx.fresh("rows")
        head = locate(ast.copy_location(set_name(rows, _rows_call("of_mask", name(key), const(ctx.src.file),
                                                                  const(s.lineno))), s), s)
        plan.replace[id(s)] = [head, _rewrite_write(w, rows)]


class _Probe:
    """A stand-in Context for `applies`: planning reads only the file name and fresh names."""

    class src:  # noqa: N801
        file = ""

    @staticmethod
    def fresh(prefix: str) -> str:
        return prefix


def may_apply(code: types.CodeType) -> bool:
    """Whether the bytecode writes through a subscript or calls `index_add_` (no source read)."""
    if "index_add_" in code.co_names or any(i.opname == "STORE_SUBSCR" for i in dis.get_instructions(code)):
        return True
    return any(may_apply(c) for c in code.co_consts if isinstance(c, types.CodeType))


def applies(fn: ast.FunctionDef) -> bool:
    """Whether the rewrite would change some scope of `fn`: a function with bounded row writes
    and no tensor-decided construct is rewritten for them alone."""
    for scope in user_scopes(fn):
        plan = _Plan()
        _plan_selections(scope, _Probe, plan)  # type: ignore[arg-type]
        _plan_masks(scope, _Probe, plan)  # type: ignore[arg-type]
        if plan.replace or plan.writes:
            return True
    return False


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    plan = _Plan()
    _plan_selections(scope, ctx, plan)
    for w, rows in plan.writes:
        plan.replace[id(w.stmt)] = [_rewrite_write(w, rows)]
    _plan_masks(scope, ctx, plan)
    if not plan.replace:
        return

    def apply(block: list[ast.stmt]) -> list[ast.stmt]:
        new: list[ast.stmt] = []
        for s in block:
            for r in plan.replace.get(id(s), [s]):  # a replacement `if` keeps the user's body: walk it too
                if not isinstance(r, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    for field_name in ("body", "orelse", "finalbody"):
                        part = getattr(r, field_name, None)
                        if isinstance(part, list) and part and isinstance(part[0], ast.stmt):
                            setattr(r, field_name, apply(part))
                    for h in getattr(r, "handlers", []) or []:
                        h.body = apply(h.body)
                new.append(r)
        return new

    scope.body = apply(scope.body)
