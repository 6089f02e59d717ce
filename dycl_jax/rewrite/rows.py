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
from typing import Any, Callable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.symbolic_shapes import statically_known_true

from dycl_jax.errors import CaptureError, Location
from dycl_jax.rewrite import modes

_UIDS = itertools.count()
# uid of one run of a selection statement -> where the user wrote it (for the proof's refusal)
LOCATIONS: dict[int, Location] = {}


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
    """A row selection: `mask` (1-D bool, dense form) or `index` (the original index value)."""

    __slots__ = ("mask", "index", "uid")

    def __init__(self, mask: torch.Tensor | None, index: Any, uid: int) -> None:
        self.mask = mask
        self.index = index
        self.uid = uid


_DENSE = contextvars.ContextVar("dycl_dense_rows", default=False)


@contextlib.contextmanager
def dense() -> Iterator[None]:
    """The staged host's capture: row selections may take the dense form. Elsewhere (the
    dispatch host, its islands and sub-hosts) a selection keeps its exact row count."""
    token = _DENSE.set(True)
    try:
        yield
    finally:
        _DENSE.reset(token)


def _captured(m: Any) -> bool:
    """The dense form only where the staged host's torch.export traces the code (the proof then
    runs on its graph): run eagerly (the eager traces) or on the dispatch host, the selection
    keeps its exact row count, whatever the rows' computation is."""
    return _DENSE.get() and isinstance(m, FakeTensor) and modes.current() in ("staging", "dry")


def _location(file: str, line: int) -> Location:
    return Location(file, line, linecache.getline(file, line).strip())


def _dense(mask: torch.Tensor, file: str, line: int) -> Rows:
    uid = next(_UIDS)
    LOCATIONS[uid] = _location(file, line)
    return Rows(mask if mask.dtype == torch.bool else mask != 0, None, uid)


def select(m: Any, original: Callable[[Any], Any], file: str, line: int) -> Rows:
    """`original(m)` is the user's `m.nonzero(as_tuple=True)[0]` (or `torch.where(m)[0]`): the
    row indices of a 1-D `m` are unique and increasing, so they are the mask `m != 0`; any other
    `m` (2-D: repeated rows) keeps its original indices."""
    if _captured(m) and m.dim() == 1:
        return _dense(m, file, line)
    return Rows(None, original(m), -1)


def of_mask(m: Any, file: str, line: int) -> Rows:
    """`out[m] = f(x[m])` with `m` a 1-D bool mask is the dense form; any other index stays as written."""
    if _captured(m) and m.dim() == 1 and m.dtype == torch.bool:
        return _dense(m, file, line)
    return Rows(None, m, -1)


def empty(rows: Rows) -> bool:
    """`sel.numel() == 0`: in the dense form an empty selection writes nothing anyway (the
    statements it skips are only writes to its rows), so the test is a static False."""
    return False if rows.mask is not None else rows.index.numel() == 0


def _unproven(rows: Rows, why: str) -> CaptureError:
    return CaptureError(f"the row selection cannot run as a masked computation over all rows: {why}",
                        location=LOCATIONS.get(rows.uid),
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
    return rows_in(x[(slice(None), *rest)], rows.uid)


def put(out: Any, rows: Rows, v: Any) -> Any:
    """`out[sel] = v`: in the dense form `where(mask, v, out)` (v computed on every row)."""
    if rows.mask is None:
        out[rows.index] = v
        return out
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
    v = rows_out(v, rows.uid).to(out.dtype)  # index_put casts to the written tensor's dtype
    return torch.where(rows.mask.reshape((-1,) + (1,) * (out.dim() - 1)), v, out)
