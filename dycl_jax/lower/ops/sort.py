"""Sorting and selection: sort, argsort, topk, max/min.dim, median, mode, searchsorted (kthvalue: quickselect.py)."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from dycl_jax.lower.ops._util import aten, norm_dim
from dycl_jax.lower.registry import register


def _keys(x, descending: bool) -> list[Any]:
    """Sort keys whose stable ascending order is torch's order (NaN counts as the largest)."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    if not descending:
        return [x]  # lax.sort already puts NaN last and treats -0.0 == 0.0
    if jnp.issubdtype(x.dtype, jnp.floating):
        # NaN first, then by -x; the NaN key keeps -NaN from sorting like NaN
        return [(~jnp.isnan(x)).astype(jnp.uint8), -x]
    return [~x]  # bitwise not reverses integer order without overflow (unlike -x at INT_MIN)


def sort_along(x, axis: int, descending: bool = False):
    """(values, int32 indices) sorted stably along `axis` in torch's order."""
    keys = _keys(x, descending)
    iota = lax.broadcasted_iota(jnp.int32, x.shape, axis)
    out = lax.sort((*keys, x, iota), dimension=axis, is_stable=True, num_keys=len(keys))
    return out[-2], out[-1]


def _sorted(x, dim: int, descending: bool):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    return sort_along(x, norm_dim(dim, x.ndim), descending)


@register(aten.sort.default)
def sort(x, dim: int = -1, descending: bool = False):
    # torch's unstable CPU sort may order equal elements differently; stable is one valid order
    return _sorted(x, dim, descending)


@register(aten.sort.stable)
def sort_stable(x, *, stable: bool | None = None, dim: int = -1, descending: bool = False):
    return _sorted(x, dim, descending)


@register(aten.argsort.default)
def argsort(x, dim: int = -1, descending: bool = False):
    return _sorted(x, dim, descending)[1]


@register(aten.argsort.stable)
def argsort_stable(x, *, stable: bool, dim: int = -1, descending: bool = False):
    return _sorted(x, dim, descending)[1]


@register(aten.msort.default)
def msort(x):
    return _sorted(x, 0, False)[0]


def _nan_with_sign(dtype, negative: bool):
    """A NaN of `dtype` with a chosen sign bit (lax.top_k orders NaN by its sign)."""
    nan = np.array(np.nan, dtype)
    return jnp.asarray(-np.abs(nan) if negative else np.abs(nan))  # abs/neg only touch the sign bit


@register(aten.topk.default)
def topk(x, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    axis = norm_dim(dim, x.ndim)
    y = jnp.moveaxis(x, axis, -1)
    # lax.top_k (many times faster than a full sort) takes the largest first and equal keys
    # by lowest index, in IEEE total order: +NaN above +inf, -NaN (as 0/0 makes) below -inf.
    # torch puts every NaN first for largest and last for smallest, so NaNs get a sign; the
    # smallest k are the largest of the reversed key (-x, or ~x for integers).
    key = y.astype(jnp.uint8) if y.dtype == jnp.bool_ else y
    if jnp.issubdtype(key.dtype, jnp.floating):
        nan = _nan_with_sign(key.dtype, negative=not largest)
        key = jnp.where(jnp.isnan(key), nan, key if largest else -key)
    elif not largest:
        key = ~key
    _, idx = lax.top_k(key, k)
    values = jnp.take_along_axis(y, idx, axis=-1)
    return jnp.moveaxis(values, -1, axis), jnp.moveaxis(idx.astype(jnp.int32), -1, axis)


def _pick(values, indices, pos, axis: int, keepdim: bool):
    """values/indices at per-row position `pos` (shaped like values with `axis` of size 1)."""
    v = jnp.take_along_axis(values, pos, axis=axis)
    i = jnp.take_along_axis(indices, pos, axis=axis)
    return (v, i) if keepdim else (jnp.squeeze(v, axis), jnp.squeeze(i, axis))


def _reduced_shape(x, axis: int):
    return x.shape[:axis] + (1,) + x.shape[axis + 1:]


def _arg_extreme(x, dim: int, keepdim: bool, fn):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    axis = norm_dim(dim, x.ndim)
    # jnp.argmax/argmin return the first index of the extreme, and of the first NaN if any,
    # like torch; the value is read at that index so NaN propagates.
    idx = jnp.expand_dims(fn(x, axis=axis).astype(jnp.int32), axis)
    val = jnp.take_along_axis(x, idx, axis=axis)
    return (val, idx) if keepdim else (jnp.squeeze(val, axis), jnp.squeeze(idx, axis))


@register(aten.max.dim)
def max_dim(x, dim: int, keepdim: bool = False):
    return _arg_extreme(x, dim, keepdim, jnp.argmax)


@register(aten.min.dim)
def min_dim(x, dim: int, keepdim: bool = False):
    return _arg_extreme(x, dim, keepdim, jnp.argmin)


def _median(x, axis: int, keepdim: bool, ignore_nan: bool):
    # the lower median (torch does not average the two middle values); NaN sorts last
    values, indices = sort_along(x, axis)
    n = x.shape[axis]
    if jnp.issubdtype(x.dtype, jnp.floating):
        nans = jnp.sum(jnp.isnan(x), axis=axis, keepdims=True, dtype=jnp.int32)
    else:
        nans = jnp.zeros(_reduced_shape(x, axis), jnp.int32)
    if ignore_nan:  # median of the non-NaN values; an all-NaN row gives its first NaN
        pos = jnp.maximum(n - nans - 1, 0) // 2
    else:  # any NaN makes the median NaN, reported at the first NaN (the first after sorting)
        pos = jnp.where(nans > 0, n - nans, (n - 1) // 2)
    return _pick(values, indices, pos, axis, keepdim)


@register(aten.median.dim)
def median_dim(x, dim: int = -1, keepdim: bool = False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    return _median(x, norm_dim(dim, x.ndim), keepdim, ignore_nan=False)


@register(aten.nanmedian.dim)
def nanmedian_dim(x, dim: int = -1, keepdim: bool = False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    return _median(x, norm_dim(dim, x.ndim), keepdim, ignore_nan=True)


@register(aten.median.default)
def median(x):
    return _median(x.reshape(-1), 0, False, ignore_nan=False)[0]


@register(aten.nanmedian.default)
def nanmedian(x):
    return _median(x.reshape(-1), 0, False, ignore_nan=True)[0]


@register(aten.mode.default)
def mode(x, dim: int = -1, keepdim: bool = False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    axis = norm_dim(dim, x.ndim)
    values, indices = sort_along(x, axis)
    s, perm = jnp.moveaxis(values, axis, -1), jnp.moveaxis(indices, axis, -1)
    n = s.shape[-1]
    # runs of equal values in sorted order: each element learns its run's first and last slot
    same = s[..., 1:] == s[..., :-1]
    edge = jnp.ones(s.shape[:-1] + (1,), bool)
    starts = jnp.concatenate([edge, ~same], -1)
    ends = jnp.concatenate([~same, edge], -1)
    iota = lax.broadcasted_iota(jnp.int32, s.shape, s.ndim - 1)
    first = lax.cummax(jnp.where(starts, iota, 0), axis=s.ndim - 1)
    last = lax.cummin(jnp.where(ends, iota, n - 1), axis=s.ndim - 1, reverse=True)
    # the longest run, the smallest value among equally long runs (argmax takes the first);
    # torch reports the value's last position in the input, the end of the stable run
    best = jnp.argmax(last - first, axis=-1)[..., None]
    val = jnp.take_along_axis(s, best, -1)
    idx = jnp.take_along_axis(perm, jnp.take_along_axis(last, best, -1), -1)
    val, idx = jnp.moveaxis(val, -1, axis), jnp.moveaxis(idx, -1, axis)
    return (val, idx) if keepdim else (jnp.squeeze(val, axis), jnp.squeeze(idx, axis))


def _search(seq, values, right: bool, side: str | None, sorter):
    side = side or ("right" if right else "left")
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter, axis=-1)
    if seq.ndim <= 1:
        return jnp.searchsorted(seq, values, side=side).astype(jnp.int32)
    # one sorted row per leading index: search each row for its own values
    lead = seq.shape[:-1]
    rows = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))(
        seq.reshape(-1, seq.shape[-1]), values.reshape(-1, values.shape[-1])
    )
    return rows.reshape(lead + values.shape[-1:]).astype(jnp.int32)


@register(aten.searchsorted.Tensor)
def searchsorted(seq, x, *, out_int32: bool = False, right: bool = False, side: str | None = None, sorter=None):
    return _search(seq, x, right, side, sorter)


@register(aten.searchsorted.Scalar)
def searchsorted_scalar(seq, x, *, out_int32: bool = False, right: bool = False, side: str | None = None, sorter=None):
    return _search(seq, jnp.asarray(x), right, side, sorter)


@register(aten.bucketize.Tensor)
def bucketize(x, boundaries, *, out_int32: bool = False, right: bool = False):
    # bucketize's right=False is searchsorted's side="left" (boundaries[i-1] < x <= boundaries[i])
    return _search(boundaries, x, right, None, None)


@register(aten.bucketize.Scalar)
def bucketize_scalar(x, boundaries, *, out_int32: bool = False, right: bool = False):
    return _search(boundaries, jnp.asarray(x), right, None, None)
