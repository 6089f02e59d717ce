"""Layout ops beyond plain views: padding, as_strided, unfold windows and diagonals."""
from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax
import torch
import torch.fx

from dycl_jax.errors import DyclError
from dycl_jax.lower.interpreter import current_node
from dycl_jax.lower.ops._util import aten, norm_dim
from dycl_jax.lower.registry import register


@register(aten.constant_pad_nd.default)
def constant_pad_nd(x, pad: Sequence[int], value: float = 0):
    # pad lists (before, after) pairs from the last dim backwards; lax.pad takes negative
    # amounts as cropping, which is exactly torch's meaning.
    cfg = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        cfg[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value, x.dtype), cfg)


def _mode_pad(x, pad: Sequence[int], mode: str):
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return jnp.pad(x, widths, mode=mode)


@register(aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default)
def reflection_pad(x, padding: Sequence[int]):
    return _mode_pad(x, padding, "reflect")


@register(aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default)
def replication_pad(x, padding: Sequence[int]):
    return _mode_pad(x, padding, "edge")


def _strided_index(numel: int, size: Sequence[int], stride: Sequence[int], offset: int) -> np.ndarray:
    """Flat storage index of every element of an as_strided view, checked to stay in bounds."""
    idx = np.full(tuple(size), offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        idx = idx + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    if idx.size and (idx.min() < 0 or idx.max() >= numel):
        raise DyclError(
            f"as_strided(size={list(size)}, stride={list(stride)}, storage_offset={offset}) reaches "
            f"outside its input of {numel} elements; dycl_jax only lowers as_strided views that "
            "stay inside their (contiguous) input",
            fix="express the view with view/reshape, slicing, unfold or expand instead of as_strided",
        )
    return idx


def _require_contiguous_input() -> None:
    """Refuse inputs whose torch storage is not their row-major layout (e.g. after `.t()`)."""
    node = current_node()
    src = node.args[0] if node is not None and node.args else None
    val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
    if isinstance(val, torch.Tensor) and (not val.is_contiguous() or val.storage_offset() != 0):
        raise DyclError(
            f"as_strided on a non-contiguous input (strides {list(val.stride())}, offset "
            f"{val.storage_offset()}): its storage order is not the JAX array's order",
            fix="call .contiguous() before the strided view, or express it with view/slicing/unfold",
        )


# Both lowerings read the input as its contiguous (row-major) storage; inputs whose torch
# strides say otherwise are refused above. Each view element is then one static flat index.
@register(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(x, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None):
    _require_contiguous_input()
    offset, size = storage_offset or 0, tuple(size)
    idx = _strided_index(x.size, size, stride, offset)
    flat = x.reshape(-1)
    contiguous = tuple(int(np.prod(size[d + 1:])) for d in range(len(size)))
    if all(n == 1 or s == c for n, s, c in zip(size, stride, contiguous)):
        # a contiguous window: a slice and a reshape, no gather
        return lax.slice_in_dim(flat, offset, offset + idx.size).reshape(size)
    return flat[jnp.asarray(idx.astype(np.int32))]


@register(aten.as_strided_scatter.default)
def as_strided_scatter(x, src, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None):
    _require_contiguous_input()
    idx = _strided_index(x.size, tuple(size), stride, storage_offset or 0)
    flat = x.reshape(-1).at[jnp.asarray(idx.reshape(-1).astype(np.int32))].set(src.reshape(-1).astype(x.dtype))
    return flat.reshape(x.shape)


@register(aten.unfold.default, aten.unfold_copy.default)
def unfold(x, dimension: int, size: int, step: int):
    if x.ndim == 0:
        return x.reshape(1)
    axis = norm_dim(dimension, x.ndim)
    count = (x.shape[axis] - size) // step + 1
    # window w, element e sits at w*step + e; gather them, then move the element axis last
    idx = np.arange(count)[:, None] * step + np.arange(size)[None, :]
    win = jnp.take(x, jnp.asarray(idx.astype(np.int32)), axis=axis)
    return jnp.moveaxis(win, axis + 1, -1)


@register(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(x, offset: int = 0, dim1: int = 0, dim2: int = 1):
    a1, a2 = norm_dim(dim1, x.ndim), norm_dim(dim2, x.ndim)
    n = diag_length(x.shape[a1], x.shape[a2], offset)
    if n == 0:  # jnp.diagonal rejects offsets past the edge; torch returns an empty diagonal
        rest = [s for i, s in enumerate(x.shape) if i not in (a1, a2)]
        return jnp.zeros((*rest, 0), x.dtype)
    return jnp.diagonal(x, offset, a1, a2)


def diag_length(rows: int, cols: int, offset: int) -> int:
    """Length of the `offset` diagonal of a rows×cols matrix (0 when it misses the matrix)."""
    return max(0, min(rows + min(offset, 0), cols - max(offset, 0)))
