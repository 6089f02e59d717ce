"""Shape and view ops: view/reshape, permute, expand, squeeze, cat, split, slice, select."""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import torch
from jax import core, lax
from jax.export import is_symbolic_dim

from dycl_jax.errors import DataDependentError, DyclError
from dycl_jax.lower.ops._util import aten, jdtype, norm_dim, norm_dims
from dycl_jax.lower.registry import register


def static_int(v: Any, what: str) -> Any:
    """A Python int (or None) for a size argument, or a `jax.export` symbolic dimension (a size
    of an input exported with symbolic shapes); a value computed from tensor data raises."""
    if v is None or isinstance(v, int) or is_symbolic_dim(v):
        return v
    if isinstance(v, jax.core.Tracer):
        raise DataDependentError(
            f"{what} comes from tensor values (e.g. .item() or a tensor argument), so the output "
            "shape depends on data; a data-dependent shape needs the dispatch host, a single "
            "XLA program cannot hold it",
            fix="compute the bound from shapes or Python numbers, or use a mask with torch.where",
        )
    return int(v)


def slice_bounds(size: Any, start: Any, end: Any, step: int) -> tuple[Any, Any]:
    """torch slice bounds clamped to [0, size] (start/end may be None, negative or ~2**63)."""
    start, end = static_int(start, "a slice start"), static_int(end, "a slice end")
    step = static_int(step, "a slice step")
    if not isinstance(step, int) or step <= 0:
        raise DyclError(f"slice step must be a positive int, got {step}", fix="use flip() for reversed slices")
    if any(is_symbolic_dim(v) for v in (size, start, end)):
        lo = _symbolic_bound(start, size, 0)
        return lo, core.max_dim(lo, _symbolic_bound(end, size, size))
    # Python's slice.indices has torch's semantics for positive steps and works on arbitrary
    # Python ints, so INT64_MAX "to the end" never reaches int32.
    lo, hi, _ = slice(start, end, step).indices(size)
    return lo, max(lo, hi)


def _symbolic_bound(v: Any, size: Any, default: Any) -> Any:
    """One slice bound clamped to [0, size] where the size or the bound is symbolic. A symbolic
    bound must be provably non-negative (JAX refuses to decide the sign otherwise, and the
    caller then exports per signature)."""
    if v is None:
        return default
    if isinstance(v, int):
        if v >= 2**31:  # torch's "to the end" (INT64_MAX): no array is that long
            return size
        return core.max_dim(v + size, 0) if v < 0 else core.min_dim(v, size)
    if not v >= 0:
        raise DyclError(f"a symbolic slice bound {v} may be negative", fix="slice with non-negative bounds")
    return core.min_dim(v, size)


@register(aten.view.default, aten._unsafe_view.default, aten.view_copy.default, aten.reshape.default)
def view(x, size: Sequence[int]):
    return jnp.reshape(x, tuple(static_int(s, "a view/reshape size") for s in size))


@register(aten.view.dtype)
def view_dtype(x, dtype: torch.dtype):
    # a bit reinterpretation; only same-width types whose width dycl_jax keeps (no int64/f64)
    target = jdtype(dtype)
    if dtype.itemsize != target.itemsize or target.itemsize != x.dtype.itemsize:
        raise DyclError(
            f"x.view({dtype}) reinterprets bits across widths or through a 64-bit type, which "
            "dycl_jax holds as 32-bit",
            fix="reinterpret only between same-width 8/16/32-bit types, or use .to(dtype) to convert values",
        )
    if x.dtype == jnp.bool_ or target == jnp.bool_:
        return x.astype(jnp.uint8).astype(target) if target == jnp.bool_ else x.astype(target)
    return lax.bitcast_convert_type(x, target)


@register(aten.permute.default, aten.permute_copy.default)
def permute(x, dims: Sequence[int]):
    return jnp.transpose(x, [norm_dim(d, x.ndim) for d in dims])


@register(aten.transpose.int, aten.transpose_copy.int)
def transpose(x, dim0: int, dim1: int):
    if x.ndim == 0:
        return x
    return jnp.swapaxes(x, norm_dim(dim0, x.ndim), norm_dim(dim1, x.ndim))


@register(aten.t.default, aten.t_copy.default)
def t(x):
    return x.T if x.ndim == 2 else x


@register(aten.movedim.int)
def movedim(x, source: int, destination: int):
    return jnp.moveaxis(x, norm_dim(source, x.ndim), norm_dim(destination, x.ndim))


@register(aten.movedim.intlist)
def movedim_list(x, source: Sequence[int], destination: Sequence[int]):
    return jnp.moveaxis(x, norm_dims(source, x.ndim) or (), norm_dims(destination, x.ndim) or ())


@register(aten.expand.default, aten.expand_copy.default)
def expand(x, size: Sequence[int], *, implicit: bool = False):
    # -1 keeps the input's size; new dims are prepended (only those may not be -1).
    size = [static_int(s, "an expand size") for s in size]
    lead = len(size) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, shape)


def _squeeze(x, dims: Sequence[int] | None):
    axes = range(x.ndim) if dims is None else {norm_dim(d, x.ndim) for d in dims}
    # torch silently keeps a named dim whose size is not 1 (jnp would raise).
    keep = tuple(a for a in axes if x.ndim and x.shape[a] == 1)
    return jnp.squeeze(x, keep) if keep else x


@register(aten.squeeze.default, aten.squeeze_copy.default)
def squeeze(x):
    return _squeeze(x, None)


@register(aten.squeeze.dim, aten.squeeze_copy.dim)
def squeeze_dim(x, dim: int):
    return _squeeze(x, [dim])


@register(aten.squeeze.dims, aten.squeeze_copy.dims)
def squeeze_dims(x, dim: Sequence[int]):
    return _squeeze(x, dim)


@register(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def unsqueeze(x, dim: int):
    return jnp.expand_dims(x, dim + x.ndim + 1 if dim < 0 else dim)


@register(aten.alias.default, aten.alias_copy.default)
def alias(x):
    return x


@register(aten.cat.default)
def cat(tensors: Sequence, dim: int = 0):
    # torch (legacy) skips 1-d empty tensors whatever the other inputs' rank.
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not kept:
        return tensors[0]
    dtype = jnp.result_type(*kept)
    return jnp.concatenate([t.astype(dtype) for t in kept], axis=norm_dim(dim, kept[0].ndim))


@register(aten.stack.default)
def stack(tensors: Sequence, dim: int = 0):
    dtype = jnp.result_type(*tensors)
    return jnp.stack([t.astype(dtype) for t in tensors], axis=norm_dim(dim, tensors[0].ndim + 1))


def _split_at(x, sizes: Sequence[int], dim: int) -> list:
    axis = norm_dim(dim, x.ndim)
    out, start = [], 0
    for s in sizes:
        out.append(lax.slice_in_dim(x, start, start + s, axis=axis))
        start += s
    return out


@register(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def split_with_sizes(x, split_sizes: Sequence[int], dim: int = 0):
    return _split_at(x, split_sizes, dim)


@register(aten.split.Tensor, aten.split_copy.Tensor)
def split(x, split_size: int, dim: int = 0):
    n = x.shape[norm_dim(dim, x.ndim)]
    if split_size == 0:
        return [x]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] or [0]
    return _split_at(x, sizes, dim)


@register(aten.chunk.default)
def chunk(x, chunks: int, dim: int = 0):
    n = x.shape[norm_dim(dim, x.ndim)]
    return split(x, -(-n // chunks) if n else 1, dim)


@register(aten.unbind.int, aten.unbind_copy.int)
def unbind(x, dim: int = 0):
    axis = norm_dim(dim, x.ndim)
    return [lax.index_in_dim(x, i, axis, keepdims=False) for i in range(x.shape[axis])]


@register(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(x, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1):
    axis = norm_dim(dim, x.ndim)
    lo, hi = slice_bounds(x.shape[axis], start, end, step)
    return lax.slice_in_dim(x, lo, hi, step, axis=axis)


@register(aten.narrow.default, aten.narrow_copy.default)
def narrow(x, dim: int, start: int, length: int):
    axis = norm_dim(dim, x.ndim)
    length = static_int(length, "a narrow length")
    if isinstance(start, jax.core.Tracer):  # a data-dependent start keeps a static shape
        start = jnp.where(start < 0, start + x.shape[axis], start)
        return lax.dynamic_slice_in_dim(x, start, length, axis=axis)
    lo = start + x.shape[axis] if start < 0 else start
    return lax.slice_in_dim(x, lo, lo + length, axis=axis)


def select_index(size: int, index: int) -> int:
    """A torch select index as a non-negative int, checked against the dim size."""
    i = index + size if index < 0 else index
    if not 0 <= i < size:
        raise DyclError(f"index {index} is out of range for a dimension of size {size}")
    return i


@register(aten.select.int, aten.select_copy.int)
def select(x, dim: int, index: int):
    axis = norm_dim(dim, x.ndim)
    if isinstance(index, jax.core.Tracer):  # e.g. x[i.item()]: the shape stays static
        index = jnp.where(index < 0, index + x.shape[axis], index)
        return lax.dynamic_index_in_dim(x, index, axis, keepdims=False)
    return lax.index_in_dim(x, select_index(x.shape[axis], index), axis, keepdims=False)


@register(aten.flip.default)
def flip(x, dims: Sequence[int]):
    axes = norm_dims(dims, x.ndim) if len(dims) else ()
    return jnp.flip(x, axes) if axes and x.ndim else x


@register(aten.roll.default)
def roll(x, shifts: Sequence[int], dims: Sequence[int] = ()):
    if not dims:  # torch rolls the flattened tensor
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), tuple(norm_dim(d, x.ndim) for d in dims))


@register(aten.repeat.default)
def repeat(x, repeats: Sequence[int]):
    x = jnp.reshape(x, (1,) * (len(repeats) - x.ndim) + x.shape)
    return jnp.tile(x, tuple(repeats))


@register(aten.repeat_interleave.Tensor)
def repeat_interleave(repeats, *, output_size: int | None = None):
    # the index i repeated repeats[i] times: output position p belongs to the first i whose
    # running total exceeds p
    if output_size is None and not isinstance(repeats, jax.core.Tracer):  # concrete: on the dispatch host
        output_size = int(repeats.sum())
    if output_size is None:
        raise DyclError(
            "repeat_interleave with a tensor of repeats has an output length that depends on "
            "tensor values; a data-dependent shape needs the dispatch host",
            fix="pass output_size=<total length> to repeat_interleave, or use a Python int of repeats",
        )
    ends = jnp.cumsum(repeats.reshape(-1))
    return jnp.searchsorted(ends, jnp.arange(output_size, dtype=ends.dtype), side="right").astype(jnp.int32)


@register(aten.tile.default)
def tile(x, dims: Sequence[int]):
    return jnp.tile(x, tuple(dims))
