"""embedding_bag: bags of embedding rows reduced by sum, mean or max (offsets, per-sample weights)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dycl_jax.errors import DyclError
from dycl_jax.lower.dtypes import int64
from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register

_SUM, _MEAN, _MAX = 0, 1, 2


def _embedding_bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx):
    """(output, offset2bag, bag_size, max_indices) as ATen's CPU kernel returns them.

    Bag b holds indices[offsets[b]:offsets[b + 1]] (the last bag runs to the end, or, with
    include_last_offset, offsets[-1] closes it). Rows equal to padding_idx are left out, also
    from a bag's size; an empty bag gives zeros in every mode."""
    if indices.ndim != 1:
        raise DyclError("embedding_bag: the ATen kernel expects 1-D indices", fix="pass 1-D indices with offsets")
    n_bags = offsets.shape[0] - (1 if include_last_offset else 0)
    positions = jnp.arange(indices.shape[0])
    # the bag of each index: how many offsets are at or before its position, minus one
    bag = jnp.searchsorted(offsets.astype(positions.dtype), positions, side="right") - 1
    # F.embedding_bag passes padding_idx as a row number, or -1 for none
    keep = indices != padding_idx if padding_idx is not None and padding_idx >= 0 else jnp.ones(indices.shape, bool)
    seg = jnp.where(keep, bag, n_bags)  # dropped and out-of-bag entries go to a segment past the end
    rows = weight[indices]
    counts = jax.ops.segment_sum(jnp.ones_like(seg), seg, num_segments=n_bags)
    if mode == _MAX:
        if per_sample_weights is not None:
            raise DyclError("embedding_bag: per_sample_weights needs mode='sum'", fix="use mode='sum'")
        top = jax.ops.segment_max(rows, seg, num_segments=n_bags)
        out = jnp.where((counts > 0)[:, None], top, jnp.zeros((), rows.dtype))
        # the first position in each bag holding that maximum, as the index into `indices`' rows
        hit = (rows == top[jnp.clip(seg, 0, n_bags - 1)]) & (seg < n_bags)[:, None]
        first = jax.ops.segment_min(jnp.where(hit, indices[:, None], weight.shape[0]), seg, num_segments=n_bags)
        arg = jnp.where((counts > 0)[:, None], first, 0)
        return out, bag, counts, arg
    # torch's CPU kernel weighs and sums float16/bfloat16 rows in float32 and rounds once
    wide = jnp.float32 if rows.dtype in (jnp.float16, jnp.bfloat16) else rows.dtype
    if per_sample_weights is not None:
        if mode != _SUM:
            raise DyclError("embedding_bag: per_sample_weights needs mode='sum'", fix="use mode='sum'")
        rows = rows.astype(wide) * per_sample_weights.astype(wide)[:, None]
    total = jax.ops.segment_sum(rows.astype(wide), seg, num_segments=n_bags)
    if mode == _MEAN:
        total = total / jnp.maximum(counts, 1).astype(total.dtype)[:, None]
    total = total.astype(weight.dtype)
    if mode == _SUM:
        zeros = jnp.zeros((n_bags,), int64())
        return total, jnp.zeros((0,), int64()), zeros, zeros
    return total, bag, counts, counts


@register(aten._embedding_bag_forward_only.default, aten._embedding_bag.default)
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    # scale_grad_by_freq and sparse change only the backward of torch's kernel: the values are the same
    return _embedding_bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx)
