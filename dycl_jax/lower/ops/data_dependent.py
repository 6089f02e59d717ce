"""Ops whose output shape or Python result depends on tensor values (nonzero, masked_select,
unique, bincount, allclose/equal): computed on concrete arrays (the dispatch host's host
statements, host/jax_ops.py); inside a traced program they raise the data-dependent error."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dycl_jax.lower.ops._util import aten, norm_dim
from dycl_jax.lower.ops.indexing import data_dependent_error
from dycl_jax.lower.registry import register


def _concrete(what: str, fixed_size_form: str, *arrays: Any) -> None:
    """Refuse traced inputs: a single XLA program cannot hold a data-dependent size."""
    if any(isinstance(a, jax.core.Tracer) for a in arrays):
        raise data_dependent_error(what, fixed_size_form)


def _size(n: Any) -> int:
    return int(np.asarray(n))


@register(aten.nonzero.default)
def nonzero(x):
    _concrete("nonzero()", "torch.nonzero_static(x, size=N) or a mask with torch.where", x)
    if x.ndim == 0:  # torch: one row (or none) with no columns
        return jnp.zeros((_size(x != 0), 0), jnp.int64)
    # computed by numpy: JAX's eager nonzero compiles a program per result size and dispatches
    # three ops (milliseconds per host statement); numpy's order is row-major, as torch's
    return jnp.asarray(np.stack(np.nonzero(np.asarray(x)), axis=1).astype(np.int64))


@register(aten.masked_select.default)
def masked_select(x, mask):
    _concrete("masked_select()", "torch.where(mask, x, 0) or x.masked_fill(~mask, 0)", x, mask)
    x, mask = np.broadcast_arrays(np.asarray(x), np.asarray(mask).astype(bool))  # by numpy, as nonzero
    return jnp.asarray(x[mask])  # row-major order, as torch's


def _unique_rows(x, dim: int, sort: bool, consecutive: bool):
    """(values, inverse, counts) of the slices of x along dim, as torch orders them."""
    moved = jnp.moveaxis(x, dim, 0)
    rows = moved.reshape(moved.shape[0], -1)
    n = rows.shape[0]
    if consecutive:
        change = jnp.concatenate([jnp.ones((min(n, 1),), bool), jnp.any(rows[1:] != rows[:-1], axis=1)])
        group = jnp.cumsum(change) - 1
        starts = jnp.nonzero(change, size=_size(change.sum()))[0]
        values = moved[starts]
        counts = jnp.diff(jnp.append(starts, n))
        return values, group, counts
    # lexicographic order of the rows (the first column most significant), stable
    order = jnp.lexsort(rows.T[::-1]) if rows.shape[1] else jnp.arange(n)
    srt = rows[order]
    change = jnp.concatenate([jnp.ones((min(n, 1),), bool), jnp.any(srt[1:] != srt[:-1], axis=1)])
    group = jnp.cumsum(change) - 1
    starts = jnp.nonzero(change, size=_size(change.sum()))[0]
    values = moved[order[starts]]
    inverse = jnp.zeros((n,), group.dtype).at[order].set(group)
    counts = jnp.diff(jnp.append(starts, n))
    return values, inverse, counts


@register(aten._unique2.default)
def unique2(x, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False):
    _concrete("unique()", "a fixed-size histogram such as one_hot(x, n).sum(0) or sort()", x)
    flat = x.reshape(-1)
    values, inverse, counts = _unique_rows(flat[:, None], 0, True, False)
    inverse = inverse.reshape(x.shape) if return_inverse else jnp.zeros((0,), jnp.int64)
    return values.reshape(-1), inverse, counts if return_counts else jnp.zeros((0,), jnp.int64)


@register(aten.unique_dim.default)
def unique_dim(x, dim: int, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False):
    _concrete("unique(dim=...)", "sort() along the dimension", x)
    d = norm_dim(dim, x.ndim)
    values, inverse, counts = _unique_rows(x, d, True, False)
    return (jnp.moveaxis(values, 0, d), inverse if return_inverse else jnp.zeros((0,), jnp.int64),
            counts if return_counts else jnp.zeros((0,), jnp.int64))


@register(aten.unique_consecutive.default)
def unique_consecutive(x, return_inverse: bool = False, return_counts: bool = False, dim: int | None = None):
    _concrete("unique_consecutive()", "a mask of changes, x[1:] != x[:-1]", x)
    if dim is None:
        values, inverse, counts = _unique_rows(x.reshape(-1)[:, None], 0, False, True)
        values, inverse = values.reshape(-1), inverse.reshape(x.shape)
    else:
        d = norm_dim(dim, x.ndim)
        values, inverse, counts = _unique_rows(x, d, False, True)
        values = jnp.moveaxis(values, 0, d)
    return (values, inverse if return_inverse else jnp.zeros((0,), jnp.int64),
            counts if return_counts else jnp.zeros((0,), jnp.int64))


@register(aten.bincount.default)
def bincount(x, weights=None, minlength: int = 0):
    _concrete("bincount()", "one_hot(x, n).sum(0) or scatter_add into zeros(n)", x)
    length = max(_size(x.max()) + 1 if x.size else 0, minlength)
    if weights is None:
        return jnp.zeros((length,), jnp.int64).at[x].add(1)
    # torch accumulates float weights in double
    return jnp.zeros((length,), jnp.float64).at[x].add(weights.astype(jnp.float64))


@register(aten.equal.default)
def equal(a, b):
    _concrete("torch.equal()", "(a == b).all()", a, b)
    return a.shape == b.shape and bool(jnp.all(a == b))


@register(aten.isclose.default)
def isclose(a, b, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False):
    # torch: equal values (infinities included) are close; else |a - b| <= atol + rtol * |b|, finite
    dtype = jnp.result_type(a, b)
    a, b = a.astype(dtype), b.astype(dtype)
    if not jnp.issubdtype(dtype, jnp.inexact):
        wide = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
        a, b = a.astype(wide), b.astype(wide)
    close = a == b
    if equal_nan:
        close = close | (jnp.isnan(a) & jnp.isnan(b))
    diff = jnp.abs(a - b)
    tol = atol + rtol * jnp.abs(b)
    return close | (jnp.isfinite(diff) & (diff <= tol))


@register(aten.allclose.default)
def allclose(a, b, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False):
    _concrete("torch.allclose()", "torch.isclose(a, b).all()", a, b)
    return bool(jnp.all(isclose(a, b, rtol, atol, equal_nan)))
