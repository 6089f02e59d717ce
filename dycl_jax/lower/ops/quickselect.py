"""kthvalue by torch's CPU quickselect, so that the index among tied values is torch's."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from dycl_jax.lower.ops._util import aten, norm_dim
from dycl_jax.lower.registry import register

# torch's kthvalue runs Sedgewick's quickselect (Sorting.cpp, quick_select_template) on a copy
# of each row and returns the value and original index left at position k-1. Which of several
# equal values ends there depends on every swap the algorithm makes, so the same swaps are
# made here, one row per vmap lane: median-of-three pivot, Hoare partition, narrowing to the
# side that holds k-1. NaN counts as larger than everything, as in torch.


def _gt(x, y):
    """torch's gt_or_nan: x > y, or x is NaN and y is not."""
    if jnp.issubdtype(x.dtype, jnp.floating):
        return (jnp.isnan(x) & ~jnp.isnan(y)) | (x > y)
    return x > y


def _swap(vals, idx, a, b):
    va, vb, ia, ib = vals[a], vals[b], idx[a], idx[b]
    return vals.at[a].set(vb).at[b].set(va), idx.at[a].set(ib).at[b].set(ia)


def _swap_if(cond, vals, idx, a, b):
    sv, si = _swap(vals, idx, a, b)
    return jnp.where(cond, sv, vals), jnp.where(cond, si, idx)


def _select_row(row, k: int):
    """(value, index) at position k of the row after torch's quickselect."""
    n = row.shape[0]

    def step(state):
        vals, idx, lo, hi, _ = state
        # a part of two: order it and stop
        two = hi == lo + 1
        # median of three into vals[lo], with vals[lo+1] <= pivot <= vals[hi] as sentinels
        mid = (lo + hi) >> 1
        v3, i3 = _swap(vals, idx, mid, lo + 1)
        v3, i3 = _swap_if(_gt(v3[lo + 1], v3[hi]), v3, i3, lo + 1, hi)
        v3, i3 = _swap_if(_gt(v3[lo], v3[hi]), v3, i3, lo, hi)
        v3, i3 = _swap_if(_gt(v3[lo + 1], v3[lo]), v3, i3, lo + 1, lo)
        piv = v3[lo]

        # the sentinels stop both scans inside [lo, hi]; the bounds only matter in the two-element
        # case, whose partition is computed (vmap runs both sides) but not used
        def scan_i(s):
            return lax.while_loop(lambda i: (i < hi) & _gt(piv, s[0][i]), lambda i: i + 1, s[2] + 1)

        def scan_j(s):
            return lax.while_loop(lambda j: (j > lo) & _gt(s[0][j], piv), lambda j: j - 1, s[3] - 1)

        def partition(s):
            vals, idx, i, j, _ = s
            i = scan_i(s)
            j = scan_j((vals, idx, i, j, False))
            crossed = j < i
            vals, idx = _swap_if(~crossed, vals, idx, i, j)
            return vals, idx, i, j, crossed

        vp, ip, i, j, _ = lax.while_loop(lambda s: ~s[4], partition, (v3, i3, lo + 1, hi, False))
        vp, ip = _swap(vp, ip, lo, j)
        new_lo = jnp.where(j <= k, i, lo)
        new_hi = jnp.where(j >= k, j - 1, hi)
        # the two-element case replaces all of that
        v2, i2 = _swap_if(_gt(vals[lo], vals[hi]), vals, idx, lo, hi)
        vals = jnp.where(two, v2, vp)
        idx = jnp.where(two, i2, ip)
        return vals, idx, jnp.where(two, lo, new_lo), jnp.where(two, hi, new_hi), two

    def running(state):
        _, _, lo, hi, finished = state
        return ~finished & (hi > lo)

    start = (row, jnp.arange(n, dtype=jnp.int32), jnp.int32(0), jnp.int32(n - 1), jnp.bool_(False))
    vals, idx, *_ = lax.while_loop(running, step, start)
    return vals[k], idx[k]


@register(aten.kthvalue.default)
def kthvalue(x, k: int, dim: int = -1, keepdim: bool = False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    axis = norm_dim(dim, x.ndim)
    rows = jnp.moveaxis(x, axis, -1)
    shape = rows.shape[:-1]
    flat = rows.reshape((-1, rows.shape[-1]))
    if flat.shape[0] == 0:
        values, indices = jnp.zeros((0,), x.dtype), jnp.zeros((0,), jnp.int32)
    else:
        values, indices = jax.vmap(lambda r: _select_row(r, k - 1))(flat)
    values, indices = values.reshape(shape), indices.reshape(shape)
    if keepdim:
        return jnp.expand_dims(values, axis), jnp.expand_dims(indices, axis)
    return values, indices
