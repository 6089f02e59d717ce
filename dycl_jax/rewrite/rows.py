"""Bounded row selections: `sel = m.nonzero(as_tuple=True)[0]; out[sel] = f(x[sel])` as the masked
dense computation `out = where(m, f(x), out)` (called by code of converters/bounded_rows.py).

A 1-D mask of static length N selects at most N rows, so computing `f` on all N rows and keeping
the selected ones is one XLA program. It equals the original only when `f` is row-wise in the
selected dimension; that is proved after capture (capture/bounded_rows.py) on the ATen graph
between the `dycl::rows_in` and `dycl::rows_out` markers these helpers put around `f`. Whatever
is not a 1-D mask here keeps the original semantics exactly (the index as written).
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import linecache
import operator
from typing import Any, Callable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.symbolic_shapes import statically_known_true

from dycl_jax.errors import CaptureError, Location
from dycl_jax.rewrite import modes

_UIDS = itertools.count()


@torch.library.custom_op("dycl::rows_in", mutates_args=())
def rows_in(x: torch.Tensor, uid: int) -> torch.Tensor:
    """Marks the dense rows gathered for selection `uid` (identity; removed after the proof)."""
    return x.clone()


@rows_in.register_fake
def _rows_in_fake(x: torch.Tensor, uid: int) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("dycl::rows_out", mutates_args=())
def rows_out(x: torch.Tensor, uid: int) -> torch.Tensor:
    """Marks the value written to the rows of selection `uid` (identity; removed after the proof)."""
    return x.clone()


@rows_out.register_fake
def _rows_out_fake(x: torch.Tensor, uid: int) -> torch.Tensor:
    return torch.empty_like(x)


class Rows:
    """A row selection: `mask` (1-D bool, dense form) or `index` (the original index value);
    `source`, run eagerly, the tensor `index` was selected from (for the emptiness tests)."""

    __slots__ = ("mask", "index", "uid", "source")

    def __init__(self, mask: torch.Tensor | None, index: Any, uid: int, source: Any = None) -> None:
        self.mask = mask
        self.index = index
        self.uid = uid
        self.source = source


# the selections of the capture in progress (None outside rows.dense()): uid of one run of a
# selection statement -> where the user wrote it, for the proof's refusal and the report; one
# table per capture, dropped when it ends, so conversions never see each other's selections
# a pytree node, so a staged `if` (the cond of `nonempty`/`empty` below) passes a selection's
# mask to its branches as an operand rather than closing over a traced tensor
torch.utils._pytree.register_pytree_node(
    Rows, lambda r: ([r.mask, r.index, r.source], r.uid), lambda leaves, uid: Rows(*leaves[:2], uid, leaves[2]))

_DENSE: contextvars.ContextVar[dict[int, Location] | None] = contextvars.ContextVar("dycl_dense_rows",
                                                                                    default=None)


@contextlib.contextmanager
def dense() -> Iterator[dict[int, Location]]:
    """The staged host's capture: row selections may take the dense form. Elsewhere (the
    dispatch host, its islands and sub-hosts) a selection keeps its exact row count. Yields
    the capture's own table of selections (uid -> location)."""
    table: dict[int, Location] = {}
    token = _DENSE.set(table)
    try:
        yield table
    finally:
        _DENSE.reset(token)


def location(uid: int) -> Location | None:
    """Where selection `uid` of the capture in progress was written (None when unknown)."""
    table = _DENSE.get()
    return table.get(uid) if table is not None else None


def _captured(m: Any) -> bool:
    """The dense form only where the staged host's torch.export traces the code (the proof then
    runs on its graph): run eagerly (the eager traces) or on the dispatch host, the selection
    keeps its exact row count, whatever the rows' computation is."""
    return _DENSE.get() is not None and isinstance(m, FakeTensor) and modes.current() in ("staging", "dry")


def _location(file: str, line: int) -> Location:
    return Location(file, line, linecache.getline(file, line).strip())


def _dense(mask: torch.Tensor, file: str, line: int) -> Rows:
    uid = next(_UIDS)
    table = _DENSE.get()
    assert table is not None, "the dense form outside rows.dense()"
    table[uid] = _location(file, line)
    return Rows(mask if mask.dtype == torch.bool else mask != 0, None, uid)


def select(m: Any, original: Callable[[Any], Any], file: str, line: int) -> Rows:
    """`original(m)` is the user's `m.nonzero(as_tuple=True)[0]` (or `torch.where(m)[0]`): the
    row indices of a 1-D `m` are unique and increasing, so they are the mask `m != 0`; any other
    `m` (2-D: repeated rows) keeps its original indices."""
    if _captured(m) and m.dim() == 1:
        return _dense(m, file, line)
    eager = isinstance(m, torch.Tensor) and not isinstance(m, FakeTensor)
    return Rows(None, original(m), -1, m if eager else None)


def of_mask(m: Any, file: str, line: int) -> Rows:
    """`out[m] = f(x[m])` with `m` a 1-D bool mask is the dense form; any other index stays as written."""
    if _captured(m) and m.dim() == 1 and m.dtype == torch.bool:
        return _dense(m, file, line)
    return Rows(None, m, -1)


def empty(rows: Rows) -> Any:
    """`sel.numel() == 0`, whose `continue` skips only writes to the selection's rows: in the
    dense form the tensor `~mask.any()`, so the writes stage under a cond that skips the rows'
    computation when no row is selected (torch computes nothing then: no value of `f` on a row
    it never sees can reach the gradient); the dense form alone would be equal without it. Run
    eagerly (the torch trace that mirrors the staged program, jm.trace's reference), the same
    tensor test on the selection's source (`nonzero` selects some row iff some element is
    nonzero), so that trace records the decision the staged cond takes."""
    if rows.mask is not None:
        return ~rows.mask.any()
    return ~(rows.source != 0).any() if rows.source is not None else rows.index.numel() == 0


def nonempty(rows: Rows) -> Any:
    """`sel.numel() > 0` guarding only writes to its rows: `mask.any()` in the dense form (see `empty`)."""
    if rows.mask is not None:
        return rows.mask.any()
    return (rows.source != 0).any() if rows.source is not None else rows.index.numel() > 0


def _unproven(rows: Rows, why: str) -> CaptureError:
    return CaptureError(f"the row selection cannot run as a masked computation over all rows: {why}",
                        location=location(rows.uid),
                        fix='convert with host="auto" (the default) or host="dispatch": that host runs the selection '
                            "with its exact row count")


def _same(a: Any, b: Any) -> bool:
    return statically_known_true(a == b)


def take(rows: Rows, x: Any, *rest: Any) -> Any:
    """`x[sel]` / `x[sel, rest...]`: in the dense form, every row of `x` (marked)."""
    if rows.mask is None:
        return x[(rows.index, *rest)] if rest else x[rows.index]
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or not _same(x.shape[0], rows.mask.shape[0]):
        raise _unproven(rows, "a tensor indexed by the selection does not have the mask's rows")
    if not all(r is None or r is Ellipsis or isinstance(r, slice) or (isinstance(r, (int, torch.SymInt))
                                                                      and not isinstance(r, bool)) for r in rest):
        raise _unproven(rows, "the selection is combined with an index that is not an int, slice or None")
    return rows_in(_safe_rows(rows.mask, x[(slice(None), *rest)]), rows.uid)


def _safe_rows(mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`x` with every unselected row replaced by the first selected one. The computation on the
    rows then only ever sees values the original computed on too: a row the original never
    selects (where `f` may be log of a negative number) cannot put a NaN or inf into the result's
    gradient through `where` (0 * inf). The selected rows are `x`'s own, so the proof holds."""
    first = mask.to(torch.uint8).argmax().reshape(1)
    return torch.where(mask.reshape((-1,) + (1,) * (x.dim() - 1)), x, x.index_select(0, first))


def put(out: Any, rows: Rows, v: Any) -> Any:
    """`out[sel] = v`: in the dense form `where(mask, v, out)` (v computed on every row)."""
    if rows.mask is None:
        out[rows.index] = v
        return out
    return _where(rows, _dense_value(out, rows, v), out)


_IN_PLACE = {"add": operator.iadd, "sub": operator.isub, "mul": operator.imul, "div": operator.itruediv}
_OUT_OF_PLACE = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}


def accumulate(out: Any, rows: Rows, v: Any, op: str) -> Any:
    """`out[sel] OP= v`: Python's getitem, in-place OP on that copy, setitem. The dense form
    `where(mask, out OP v, out)` equals it because the selected rows are distinct (each row is
    read and written once); `v`'s rows are computed on every row as for `put`."""
    if rows.mask is None:
        part = out[rows.index]
        part = _IN_PLACE[op](part, v)
        out[rows.index] = part
        return out
    if not (isinstance(out, torch.Tensor) and isinstance(v, (torch.Tensor, int, float)) and not isinstance(v, bool)):
        raise _unproven(rows, "an in-place update of rows by a value that is not a tensor or number")
    # the in-place op on the gathered rows computes in the type promoted from both as written
    # (a 0-dim `v` is weaker than the rows) and casts back, or torch refuses the cast
    computed = torch.result_type(out, v)
    if not torch.can_cast(computed, out.dtype):
        raise _unproven(rows, f"torch refuses the in-place {op} of a {computed} value into {out.dtype} rows")
    value = _dense_value(out, rows, v, cast=False)
    return _where(rows, _OUT_OF_PLACE[op](out.to(computed), value.to(computed)).to(out.dtype), out)


def index_add(out: Any, rows: Rows, v: Any) -> Any:
    """`out.index_add_(0, sel, v)`: with distinct rows (the dense form's), `out[sel] += v`."""
    if rows.mask is None:
        out.index_add_(0, rows.index, v)
        return out
    if not (isinstance(out, torch.Tensor) and isinstance(v, torch.Tensor) and v.dtype == out.dtype
            and v.dim() == out.dim()):
        raise _unproven(rows, "index_add_ of a value that is not a tensor of the written tensor's dtype and rank")
    if not all(_same(a, b) for a, b in zip(v.shape, (rows.mask.shape[0], *out.shape[1:]))):
        raise _unproven(rows, "index_add_ of a value not shaped like the selected rows (it does not broadcast)")
    return _where(rows, out + _dense_value(out, rows, v), out)


def _where(rows: Rows, v: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.where(rows.mask.reshape((-1,) + (1,) * (out.dim() - 1)), v, out)


def _dense_value(out: Any, rows: Rows, v: Any, cast: bool = True) -> torch.Tensor:
    """The value written to the selected rows, checked and broadcast as index_put would, marked
    and (`cast`) cast to `out`'s dtype: one value per row of the mask."""
    n = rows.mask.shape[0]
    if not isinstance(out, torch.Tensor) or out.dim() < 1 or not _same(out.shape[0], n):
        raise _unproven(rows, "the written tensor does not have the mask's rows")
    if not isinstance(v, torch.Tensor):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not out.is_floating_point()):
            raise _unproven(rows, "the written value is not a tensor")
        v = torch.full((), v, dtype=out.dtype)
    if v.dim() > out.dim():
        raise _unproven(rows, "the written value has more dimensions than the rows it replaces")
    while v.dim() < out.dim():  # index_put broadcasts from the last dimension, as where does
        v = v.unsqueeze(0)
    # index_put broadcasts `v` to the selected rows' shape: each dimension 1 or the rows' own
    wanted = (n, *out.shape[1:])
    if not all(_same(a, 1) or _same(a, b) for a, b in zip(v.shape, wanted)):
        raise _unproven(rows, "the written value does not broadcast to the selected rows")
    v = rows_out(v, rows.uid)
    return v.to(out.dtype) if cast else v  # index_put casts to the written tensor's dtype
