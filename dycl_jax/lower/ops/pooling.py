"""Pooling: max/avg pooling (1d-3d, torch's flat indices), adaptive avg/max pooling."""
from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.ops.conv import expand_ints
from dycl_jax.lower.registry import register

# Spatial sizes are static under jit (only the batch dim is dynamic, and it is concrete at
# trace time), so every window table below is built with numpy while tracing.


def _pool_out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    # torch drops a last window that would start inside the right padding
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _low_value(dtype) -> np.generic:
    # a numpy scalar, not a jax array: lax.reduce_window recognises (max, -inf) as the
    # differentiable max-pool primitive only for a concrete numpy/Python init value
    dtype = np.dtype(dtype)
    return dtype.type(-np.inf if jnp.issubdtype(dtype, jnp.floating) else np.iinfo(dtype).min)


def _pool_params(x, n, kernel_size, stride, padding, dilation, ceil_mode):
    k = expand_ints(kernel_size, n, "kernel_size")
    s = expand_ints(stride, n, "stride") if stride else k  # ATen: empty stride means kernel_size
    p = expand_ints(padding, n, "padding")
    d = expand_ints(dilation, n, "dilation")
    sizes = x.shape[-n:]
    outs = tuple(_pool_out_size(sz, *a, ceil_mode) for sz, *a in zip(sizes, k, s, p, d))
    # high-side padding: p plus whatever a ceil-mode window reaches beyond it
    pads = [
        (pi, max(pi, (o - 1) * si + di * (ki - 1) + 1 - sz - pi))
        for sz, o, ki, si, pi, di in zip(sizes, outs, k, s, p, d)
    ]
    return k, s, p, d, outs, pads


def _window_tables(sizes, outs, k, s, p, d):
    """Per spatial axis, an (out, k) table of input positions each window reads (may be
    outside [0, size): those are padding)."""
    return [
        (np.arange(o)[:, None] * si - pi + np.arange(ki)[None, :] * di)
        for o, ki, si, pi, di in zip(outs, k, s, p, d)
    ]


def _gather_windows(x, tables, fill):
    """x[..., spatial] → windows x[..., out_1, ..., out_n, K] with K = ∏k_i (positions outside
    the input read `fill`), plus numpy (out..., K) tables of each element's flat input index
    and of whether it lies inside the input."""
    n = len(tables)
    sizes = x.shape[-n:]
    lead = x.ndim - n
    idx_axes, valid, flat = [], np.ones((), bool), np.zeros((), np.int64)
    for ax, (t, sz) in enumerate(zip(tables, sizes)):
        # axis `ax`'s (out, k) table broadcast to (o1, k1, o2, k2, ...), singleton elsewhere
        shape = [1] * (2 * n)
        shape[2 * ax], shape[2 * ax + 1] = t.shape
        tb = t.reshape(shape)
        valid = valid & (tb >= 0) & (tb < sz)
        flat = flat * sz + tb
        idx_axes.append(jnp.asarray(np.clip(tb, 0, sz - 1).astype(np.int32)))
    full = [t.shape[j] for t in tables for j in (0, 1)]
    valid, flat = np.broadcast_to(valid, full), np.broadcast_to(flat, full)
    win = x[(Ellipsis, *idx_axes)]  # (..., o1, k1, o2, k2, ...)
    win = jnp.where(jnp.asarray(valid), win, fill)
    # kernel axes last, merged: (..., o1, ..., on, k1*...*kn)
    order = [2 * i for i in range(n)] + [2 * i + 1 for i in range(n)]
    win = jnp.transpose(win, list(range(lead)) + [lead + a for a in order])
    outs = win.shape[lead:lead + n]
    win = win.reshape(win.shape[:lead + n] + (-1,))
    valid = valid.transpose(order).reshape(*outs, -1)
    flat = flat.transpose(order).reshape(*outs, -1)
    return win, flat, valid


def _argmax_position(win, valid):
    """Window-local position of torch's choice: the first maximum among positions inside the
    input, except that a NaN beats everything (torch keeps the last NaN it meets)."""
    valid = jnp.asarray(valid)
    low = _low_value(win.dtype)
    if jnp.issubdtype(win.dtype, jnp.floating):
        nan = jnp.isnan(win) & valid
        ok = valid & ~nan
    else:
        nan, ok = None, valid
    key = jnp.where(ok, win, low)
    hit = ok & (key == key.max(axis=-1, keepdims=True))
    pos = jnp.argmax(hit, axis=-1)
    if nan is not None:
        last_nan = win.shape[-1] - 1 - jnp.argmax(nan[..., ::-1], axis=-1)
        pos = jnp.where(nan.any(axis=-1), last_nan, pos)
    return pos


def _flat_index(flat, pos):
    table = jnp.broadcast_to(jnp.asarray(flat.astype(np.int32)), pos.shape + flat.shape[-1:])
    return jnp.take_along_axis(table, pos[..., None], axis=-1)[..., 0]


def _max_pool(x, n, kernel_size, stride, padding, dilation, ceil_mode):
    k, s, p, d, outs, pads = _pool_params(x, n, kernel_size, stride, padding, dilation, ceil_mode)
    lead = x.ndim - n
    low = _low_value(x.dtype)
    values = lax.reduce_window(
        x, low, lax.max,
        window_dimensions=(1,) * lead + k,
        window_strides=(1,) * lead + s,
        padding=[(0, 0)] * lead + pads,
        window_dilation=(1,) * lead + d,
    )
    # indices come from an explicit window gather; XLA drops it when only values are used
    win, flat, valid = _gather_windows(x, _window_tables(x.shape[-n:], outs, k, s, p, d), low)
    return values, _flat_index(flat, _argmax_position(win, valid))


@register(aten.max_pool1d_with_indices.default)
def max_pool1d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, 1, kernel_size, stride, padding, dilation, ceil_mode)


@register(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, 2, kernel_size, stride, padding, dilation, ceil_mode)


@register(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, 3, kernel_size, stride, padding, dilation, ceil_mode)


@register(aten.max_pool1d.default)
def max_pool1d(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, 1, kernel_size, stride, padding, dilation, ceil_mode)[0]


@register(aten.max_pool2d.default)
def max_pool2d(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, 2, kernel_size, stride, padding, dilation, ceil_mode)[0]


@register(aten.max_pool3d.default)
def max_pool3d(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, 3, kernel_size, stride, padding, dilation, ceil_mode)[0]


def _avg_pool(x, n, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    k, s, p, _, outs, pads = _pool_params(x, n, kernel_size, stride, padding, (1,), ceil_mode)
    lead = x.ndim - n
    acc = x if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize >= 4 else x.astype(jnp.float32)
    total = lax.reduce_window(
        acc, np.dtype(acc.dtype).type(0), lax.add,
        window_dimensions=(1,) * lead + k,
        window_strides=(1,) * lead + s,
        padding=[(0, 0)] * lead + pads,
    )
    if divisor_override:
        return total / divisor_override
    # torch's divisor per window: padding counts only up to size+p (never ceil-mode overhang),
    # and not at all without count_include_pad
    div = np.ones((), np.float64)
    for ax, (sz, o, ki, si, pi) in enumerate(zip(x.shape[-n:], outs, k, s, p)):
        start = np.arange(o) * si - pi
        end = np.minimum(start + ki, sz + pi)
        if not count_include_pad:
            start, end = np.maximum(start, 0), np.minimum(end, sz)
        shape = [1] * n
        shape[ax] = o
        div = div * (end - start).reshape(shape)
    return total / jnp.asarray(div.astype(np.float32))


@register(aten.avg_pool1d.default)
def avg_pool1d(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True):
    return _avg_pool(x, 1, kernel_size, stride, padding, ceil_mode, count_include_pad, None)


@register(aten.avg_pool2d.default)
def avg_pool2d(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@register(aten.avg_pool3d.default)
def avg_pool3d(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def _adaptive_table(size: int, out: int) -> np.ndarray:
    """(out, L) input positions of torch's adaptive bins [floor(i*in/out), ceil((i+1)*in/out)),
    padded to the longest bin L with -1 (an invalid position)."""
    i = np.arange(out)
    start = (i * size) // out
    end = -((-(i + 1) * size) // out)
    length = int((end - start).max())
    pos = start[:, None] + np.arange(length)[None, :]
    return np.where(pos < end[:, None], pos, -1)


def _adaptive_outs(x, n: int, output_size: Sequence[int | None]) -> tuple[int, ...]:
    out = expand_ints([o if o is not None else -1 for o in output_size], n, "output_size")
    return tuple(sz if o is None or o < 0 else o for sz, o in zip(x.shape[-n:], out))


def _adaptive_avg(x, n, output_size):
    outs = _adaptive_outs(x, n, output_size)
    acc = x if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize >= 4 else x.astype(jnp.float32)
    # averaging is separable: a bin's mean is the mean over each axis in turn
    for ax in range(n):
        axis = acc.ndim - n + ax
        sz, o = acc.shape[axis], outs[ax]
        if sz % o == 0:  # equal, non-overlapping bins
            shape = acc.shape[:axis] + (o, sz // o) + acc.shape[axis + 1:]
            acc = acc.reshape(shape).mean(axis=axis + 1)
            continue
        table = _adaptive_table(sz, o)
        valid = table >= 0
        g = jnp.take(acc, jnp.asarray(np.where(valid, table, 0).astype(np.int32)), axis=axis)  # (.., o, L, ..)
        shape = [1] * g.ndim
        shape[axis], shape[axis + 1] = table.shape
        w = (valid / valid.sum(axis=1, keepdims=True)).astype(np.float32).reshape(shape)
        acc = (g * jnp.asarray(w, acc.dtype)).sum(axis=axis + 1)
    return acc


@register(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(x, output_size):
    return _adaptive_avg(x, 2, output_size)


@register(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(x, output_size):
    return _adaptive_avg(x, 3, output_size)


@register(aten.adaptive_avg_pool1d.default)
def adaptive_avg_pool1d(x, output_size):
    return _adaptive_avg(x, 1, output_size)


def _adaptive_max(x, n, output_size):
    outs = _adaptive_outs(x, n, output_size)
    tables = [_adaptive_table(sz, o) for sz, o in zip(x.shape[-n:], outs)]
    win, flat, valid = _gather_windows(x, tables, _low_value(x.dtype))
    pos = _argmax_position(win, valid)
    # values are read at the chosen position, so gradients reach exactly torch's argmax
    return jnp.take_along_axis(win, pos[..., None], axis=-1)[..., 0], _flat_index(flat, pos)


@register(aten.adaptive_max_pool1d.default)
def adaptive_max_pool1d(x, output_size):
    return _adaptive_max(x, 1, output_size)


@register(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(x, output_size):
    return _adaptive_max(x, 2, output_size)


@register(aten.adaptive_max_pool3d.default)
def adaptive_max_pool3d(x, output_size):
    return _adaptive_max(x, 3, output_size)

