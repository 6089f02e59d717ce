"""Advanced indexing: index.Tensor, index_put, index_select/add/fill/copy, embedding, take, masks."""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from dycl_jax.errors import DyclError
from dycl_jax.lower.ops._util import aten, norm_dim
from dycl_jax.lower.registry import register


def data_dependent_error(what: str, fixed_size_form: str) -> DyclError:
    """The error for an op whose output shape depends on tensor values."""
    return DyclError(
        f"{what} has an output shape that depends on tensor values; a data-dependent shape "
        "needs the dispatch host (eager pieces between jitted ones), a single XLA program "
        "cannot hold it",
        fix=f"use a fixed-size form instead, e.g. {fixed_size_form}, or move this step out of "
        "the converted method",
    )


def _is_mask(t: Any) -> bool:
    # torch also reads uint8 index tensors as (deprecated) boolean masks
    return t is not None and t.dtype in (jnp.bool_, jnp.uint8)


def _static_indices(indices: Sequence[Any], what: str) -> list[Any]:
    """Replace boolean masks by their nonzero() index arrays; only known (untraced) masks allow it."""
    out: list[Any] = []
    for t in indices:
        if not _is_mask(t):
            out.append(t)
            continue
        if isinstance(t, jax.core.Tracer):
            raise data_dependent_error(
                f"{what} with a boolean mask",
                "torch.where(mask, x, other) or x.masked_fill(~mask, 0) instead of x[mask]",
            )
        out.extend(jnp.asarray(i, jnp.int32) for i in np.nonzero(np.asarray(t)))
    return out


def _index_tuple(indices: Sequence[Any]) -> tuple:
    return tuple(slice(None) if t is None else t for t in indices)


@register(aten.index.Tensor, aten._unsafe_index.Tensor)
def index(x, indices: Sequence[Any]):
    # torch's advanced indexing follows numpy's rules (None = full slice, non-adjacent index
    # tensors move their broadcast dims to the front), which jnp implements too.
    return x[_index_tuple(_static_indices(indices, "x[mask]"))]


def _masked_put(x, mask, pos: int, values, accumulate: bool):
    """x[..., mask, ...] = values via where(), for values that do not vary along the mask."""
    k = mask.ndim
    target = (*x.shape[:pos], None, *x.shape[pos + k:])  # None: the nnz dim
    values = jnp.reshape(values, (1,) * (len(target) - values.ndim) + values.shape)
    if values.shape[pos] != 1:
        raise data_dependent_error(
            "x[mask] = values with one value per selected element",
            "torch.where(mask, values_full, x) with values shaped like x",
        )
    values = values.reshape(values.shape[:pos] + (1,) * k + values.shape[pos + 1:])
    m = mask.astype(bool).reshape((1,) * pos + mask.shape + (1,) * (x.ndim - pos - k))
    values = values.astype(x.dtype)
    if accumulate:
        return x + jnp.where(m, values, jnp.zeros((), x.dtype))
    return jnp.where(m, values, x)


@register(aten.index_put.default, aten._unsafe_index_put.default)
def index_put(x, indices: Sequence[Any], values, accumulate: bool = False):
    masks = [i for i, t in enumerate(indices) if _is_mask(t)]
    others = [t for i, t in enumerate(indices) if i not in masks]
    if len(masks) == 1 and all(t is None for t in others):
        pos = masks[0]  # a mask at position p covers dims p .. p+mask.ndim-1
        return _masked_put(x, indices[pos], pos, values, accumulate)
    idx = _index_tuple(_static_indices(indices, "x[mask] = values"))
    if accumulate and x.dtype == jnp.bool_:  # torch accumulates bools as `or`; JAX does not add bools
        return x.astype(jnp.int32).at[idx].add(values.astype(jnp.int32)) != 0
    values = values.astype(x.dtype)
    return x.at[idx].add(values) if accumulate else x.at[idx].set(values)


def _along(x, dim: int):
    """x with `dim` moved first (and 0-d made 1-d), plus the function that undoes it."""
    if x.ndim == 0:
        return x.reshape(1), lambda y: y.reshape(())
    axis = norm_dim(dim, x.ndim)
    return jnp.moveaxis(x, axis, 0), lambda y: jnp.moveaxis(y, 0, axis)


def _src_along(src, dim: int, ndim: int):
    if ndim == 0 or src.ndim == 0:
        return src.reshape(-1)
    return jnp.moveaxis(src, norm_dim(dim, ndim), 0)


@register(aten.index_select.default)
def index_select(x, dim: int, index):
    if x.ndim == 0:
        return x
    return jnp.take(x, index.reshape(-1), axis=norm_dim(dim, x.ndim))


@register(aten.index_add.default)
def index_add(x, dim: int, index, source, *, alpha: float = 1):
    y, back = _along(x, dim)
    src = _src_along(source, dim, x.ndim)
    if alpha != 1:
        src = src * alpha
    if x.dtype == jnp.bool_:  # torch adds bools as `or`; JAX does not add bools
        return back(y.astype(jnp.int32).at[index.reshape(-1)].add(src.astype(jnp.int32)) != 0)
    return back(y.at[index.reshape(-1)].add(src.astype(x.dtype)))


@register(aten.index_copy.default)
def index_copy(x, dim: int, index, source):
    y, back = _along(x, dim)
    return back(y.at[index.reshape(-1)].set(_src_along(source, dim, x.ndim).astype(x.dtype)))


@register(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(x, dim: int, index, value):
    y, back = _along(x, dim)
    return back(y.at[index.reshape(-1)].set(jnp.asarray(value).astype(x.dtype)))


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x, mask, value):
    return jnp.where(mask, jnp.asarray(value).astype(x.dtype), x)


@register(aten.masked_scatter.default)
def masked_scatter(x, mask, source):
    # The k-th True element (row-major) takes source.flat[k]: a running count of the mask
    # gives every position its source index, so the shape stays static.
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    m = jnp.broadcast_to(mask, shape).reshape(-1)
    pos = jnp.clip(jnp.cumsum(m.astype(jnp.int32)) - 1, 0, max(source.size - 1, 0))
    picked = source.reshape(-1)[pos].astype(x.dtype) if source.size else jnp.zeros(m.shape, x.dtype)
    return jnp.where(m, picked, jnp.broadcast_to(x, shape).reshape(-1)).reshape(shape)


@register(aten.embedding.default)
def embedding(weight, indices, padding_idx: int = -1, scale_grad_by_freq: bool = False, sparse: bool = False):
    out = jnp.take(weight, indices, axis=0)
    if padding_idx is not None and padding_idx >= 0:
        # torch never updates the padding row: its gradient is zero, so stop it here too
        out = jnp.where((indices == padding_idx)[..., None], lax.stop_gradient(out), out)
    return out


@register(aten.take.default)
def take(x, index):
    return x.reshape(-1)[index]


@register(aten.put.default)
def put(x, index, source, accumulate: bool = False):
    flat, idx, src = x.reshape(-1), index.reshape(-1), source.reshape(-1).astype(x.dtype)
    if accumulate and flat.dtype == jnp.bool_:  # torch adds bools as a logical or
        return flat.at[idx].max(src).reshape(x.shape)
    out = flat.at[idx].add(src) if accumulate else flat.at[idx].set(src)
    return out.reshape(x.shape)


@register(aten.nonzero_static.default)
def nonzero_static(x, *, size: int, fill_value: int = -1):
    if x.ndim == 0:  # a 0-d input has no index columns
        return jnp.full((size, 0), fill_value, jnp.int32)
    cols = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(cols, axis=1).astype(jnp.int32)
