"""gather and the scatter family: scatter(_add/_reduce), index_reduce, slice/select/diagonal_scatter."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from dycl_jax.errors import DyclError
from dycl_jax.lower.ops._util import aten, norm_dim
from dycl_jax.lower.ops.layout import diag_length
from dycl_jax.lower.ops.shape import select_index, slice_bounds
from dycl_jax.lower.registry import register

_REDUCE_ALIASES = {"add": "sum", "multiply": "prod"}


def _coords(index, axis: int) -> tuple:
    """Full coordinates of a scatter/gather along `axis`: the index there, the position elsewhere."""
    return tuple(
        index if d == axis else lax.broadcasted_iota(jnp.int32, index.shape, d) for d in range(index.ndim)
    )


def _crop(t, shape: tuple[int, ...]):
    # torch lets src/self be larger than index in every dim; only the leading block is used
    return t[tuple(slice(0, n) for n in shape)] if t.shape != shape else t


def _lowest(dtype) -> Any:
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _highest(dtype) -> Any:
    return jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).max


def scatter_reduce_at(x, coords: tuple, src, reduce: str, include_self: bool):
    """x with src reduced into x[coords] (torch's scatter_reduce / index_reduce semantics)."""
    reduce = _REDUCE_ALIASES.get(reduce, reduce)
    src = src.astype(x.dtype)
    if reduce == "sum":
        base = x if include_self else x.at[coords].set(0)
        return base.at[coords].add(src)
    if reduce == "prod":
        base = x if include_self else x.at[coords].set(1)
        return base.at[coords].multiply(src)
    if reduce == "amax":
        base = x if include_self else x.at[coords].set(_lowest(x.dtype))
        return base.at[coords].max(src)
    if reduce == "amin":
        base = x if include_self else x.at[coords].set(_highest(x.dtype))
        return base.at[coords].min(src)
    if reduce == "mean":
        base = x if include_self else x.at[coords].set(0)
        total = base.at[coords].add(src)
        count = jnp.zeros(x.shape, jnp.int32).at[coords].add(1) + int(include_self)
        safe = jnp.maximum(count, 1).astype(x.dtype)
        mean = total / safe if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.floor_divide(total, safe)
        return jnp.where(count > 0, mean, x)
    raise DyclError(f"unknown scatter reduction {reduce!r}", fix="use sum, prod, mean, amax or amin")


@register(aten.gather.default)
def gather(x, dim: int, index, *, sparse_grad: bool = False):
    if index.size == 0:  # torch accepts an empty index of any rank
        return jnp.zeros(index.shape, x.dtype)
    if x.ndim == 0:
        return x.reshape(1)[index.reshape(-1)].reshape(index.shape)
    axis = norm_dim(dim, x.ndim)
    shape = tuple(x.shape[d] if d == axis else n for d, n in enumerate(index.shape))
    return jnp.take_along_axis(_crop(x, shape), index, axis=axis)


def _values(src, shape: tuple[int, ...]):
    """The block of src a scatter uses: a Python scalar or 0-d tensor fills, a tensor is cropped."""
    if not hasattr(src, "ndim") or src.ndim == 0:
        return jnp.broadcast_to(jnp.asarray(src), shape)
    return _crop(src, shape)


def _scatter(x, dim: int, index, src, apply):
    """apply(x, coords, values) along `dim`; an empty index (of any rank, as torch allows) is a no-op."""
    if index.size == 0:
        return x
    if x.dtype == jnp.bool_:  # JAX does not add or compare bools in a scatter; torch's bool sum and max are `or`, min `and`
        return _scatter(x.astype(jnp.int32), dim, index, jnp.asarray(src).astype(jnp.int32), apply) != 0
    if x.ndim == 0:
        x1, idx, axis = x.reshape(1), index.reshape(1), 0
    else:
        x1, idx, axis = x, index, norm_dim(dim, x.ndim)
    return apply(x1, _coords(idx, axis), _values(src, idx.shape).astype(x.dtype)).reshape(x.shape)


@register(aten.scatter.src, aten.scatter.value)
def scatter(x, dim: int, index, src):
    return _scatter(x, dim, index, src, lambda y, at, v: y.at[at].set(v))


@register(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_with_reduce(x, dim: int, index, src, *, reduce: str):
    return _scatter(x, dim, index, src, lambda y, at, v: scatter_reduce_at(y, at, v, reduce, True))


@register(aten.scatter_add.default)
def scatter_add(x, dim: int, index, src):
    return _scatter(x, dim, index, src, lambda y, at, v: y.at[at].add(v))


@register(aten.scatter_reduce.two)
def scatter_reduce(x, dim: int, index, src, reduce: str, *, include_self: bool = True):
    return _scatter(x, dim, index, src, lambda y, at, v: scatter_reduce_at(y, at, v, reduce, include_self))


@register(aten.index_reduce.default)
def index_reduce(x, dim: int, index, source, reduce: str, *, include_self: bool = True):
    if x.ndim == 0:
        return scatter_reduce_at(x.reshape(1), (index.reshape(-1),), source.reshape(-1), reduce, include_self)[0]
    axis = norm_dim(dim, x.ndim)
    y, src = jnp.moveaxis(x, axis, 0), jnp.moveaxis(source, axis, 0)
    out = scatter_reduce_at(y, (index.reshape(-1),), src, reduce, include_self)
    return jnp.moveaxis(out, 0, axis)


@register(aten.slice_scatter.default)
def slice_scatter(x, src, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1):
    axis = norm_dim(dim, x.ndim)
    lo, hi = slice_bounds(x.shape[axis], start, end, step)
    where = (slice(None),) * axis + (slice(lo, hi, step),)
    return x.at[where].set(src.astype(x.dtype))


@register(aten.select_scatter.default)
def select_scatter(x, src, dim: int, index: int):
    axis = norm_dim(dim, x.ndim)
    if isinstance(index, jax.core.Tracer):  # an index read from a tensor: still a static shape
        index = jnp.where(index < 0, index + x.shape[axis], index)
    else:
        index = select_index(x.shape[axis], index)
    where = (slice(None),) * axis + (index,)
    return x.at[where].set(src.astype(x.dtype))


@register(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset: int = 0, dim1: int = 0, dim2: int = 1):
    a1, a2 = norm_dim(dim1, x.ndim), norm_dim(dim2, x.ndim)
    n = diag_length(x.shape[a1], x.shape[a2], offset)
    if n == 0:
        return x
    rows = jnp.arange(n) + max(-offset, 0)
    cols = jnp.arange(n) + max(offset, 0)
    # with both matrix dims last, x[..., rows, cols] has the diagonal last, as src does
    y = jnp.moveaxis(x, (a1, a2), (-2, -1))
    y = y.at[..., rows, cols].set(src.astype(x.dtype))
    return jnp.moveaxis(y, (-2, -1), (a1, a2))
