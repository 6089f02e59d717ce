"""grid_sample: grid_sampler_2d / 3d (bilinear, nearest, bicubic; zeros, border, reflection padding)."""
from __future__ import annotations

import itertools
import math

import jax.numpy as jnp

from dycl_jax.errors import DyclError
from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register

# Follows ATen's GridSampler.h: the same unnormalisation, padding and tap rules, so the same
# pixels are read with the same weights; gradients (to the input and to the grid) come from
# differentiating these formulas, which matches torch's hand-written backward (zero gradient
# where a coordinate is clipped, a sign flip where it is reflected).
_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2
_CUBIC_A = -0.75


def _unnormalize(coord, size: int, align_corners: bool):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _reflect(coord, twice_low: int, twice_high: int):
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    coord = coord - low
    coord = jnp.where(coord < 0, -coord, coord)  # not abs: torch's gradient at 0 is +1
    extra = jnp.fmod(coord, span)
    flips = jnp.floor(coord / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _clip(coord, size: int):
    # not jnp.clip, whose gradient at a bound is 1/2: torch's is 0 at and beyond either bound
    return jnp.where(coord <= 0, 0, jnp.where(coord >= size - 1, size - 1, coord)).astype(coord.dtype)


def _pad(coord, size: int, padding: int, align_corners: bool):
    """Where a coordinate lands after the padding rule (zeros padding keeps it as is)."""
    if padding == _BORDER:
        return _clip(coord, size)
    if padding == _REFLECTION:
        if align_corners:
            coord = _reflect(coord, 0, 2 * (size - 1))
        else:
            coord = _reflect(coord, -1, 2 * size - 1)
        return _clip(coord, size)
    return coord


def _weighted_taps(rows, taps: list[list], weights: list, sizes: tuple[int, ...], out_shape: tuple[int, ...]):
    """sum over taps t of weights[t] * rows[n, taps[t]...], as (N, C, *out_shape).

    rows is (N, prod(sizes), C); each tap is one integer index array per spatial axis, of
    shape (N, *out_shape); a tap outside the input reads 0. All taps are read by one gather
    of whole channel rows, which keeps the XLA program (and its compile time) small."""
    n, c = rows.shape[0], rows.shape[2]
    idx = [jnp.stack([t[d] for t in taps], 1).reshape(n, len(taps), -1) for d in range(len(sizes))]
    valid = jnp.ones(idx[0].shape, bool)
    lin = jnp.zeros(idx[0].shape, jnp.int32)
    for i, size in zip(idx, sizes):
        valid &= (i >= 0) & (i < size)
        lin = lin * size + jnp.clip(i, 0, size - 1).astype(jnp.int32)
    vals = rows[jnp.arange(n)[:, None], lin.reshape(n, -1)].reshape(n, len(taps), -1, c)
    w = jnp.stack(weights, 1).reshape(n, len(taps), -1)
    w = jnp.where(valid, w, jnp.zeros((), w.dtype)).astype(rows.dtype)
    out = (vals * w[..., None]).sum(1)  # a fused multiply-add, cheaper for XLA than a dot here
    return jnp.moveaxis(out, 2, 1).reshape((n, c) + out_shape)


def _cubic_weights(t):
    a = _CUBIC_A

    def near(u):
        return ((a + 2) * u - (a + 3)) * u * u + 1

    def far(u):
        return ((a * u - 5 * a) * u + 8 * a) * u - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _grid_sample(x, grid, mode: int, padding: int, align_corners: bool):
    sizes = tuple(x.shape[2:])
    nd = len(sizes)
    out_shape = tuple(grid.shape[1:-1])
    rows = jnp.moveaxis(x.reshape(x.shape[:2] + (-1,)), 1, 2)  # (N, points, C): channels gathered together
    # grid's last axis lists coordinates fastest axis first: (x, y[, z]) index (W, H[, D])
    coords = [_unnormalize(grid[..., nd - 1 - d], sizes[d], align_corners) for d in range(nd)]
    if mode == _BICUBIC:
        if nd != 2:
            raise DyclError("grid_sample: bicubic interpolation needs a 4-D input", fix="use mode='bilinear'")
        base = [jnp.floor(c) for c in coords]
        weights = [_cubic_weights(c - b) for c, b in zip(coords, base)]
        # each tap's integer position goes through the padding rule on its own, as ATen does
        pos = [[jnp.floor(_pad(b - 1 + k, s, padding, align_corners)).astype(jnp.int32) for k in range(4)]
               for b, s in zip(base, sizes)]
        taps = [[pos[0][i], pos[1][j]] for i, j in itertools.product(range(4), range(4))]
        tap_w = [weights[0][i] * weights[1][j] for i, j in itertools.product(range(4), range(4))]
        return _weighted_taps(rows, taps, tap_w, sizes, out_shape)
    coords = [_pad(c, s, padding, align_corners) for c, s in zip(coords, sizes)]
    if mode == _NEAREST:
        # round half to even, as nearbyint
        taps = [[jnp.round(c).astype(jnp.int32) for c in coords]]
        return _weighted_taps(rows, taps, [jnp.ones_like(coords[0])], sizes, out_shape)
    if mode != _BILINEAR:
        raise DyclError(f"grid_sample: unknown interpolation mode {mode}", fix="use 'bilinear', 'nearest' or 'bicubic'")
    low = [jnp.floor(c) for c in coords]
    taps, tap_w = [], []
    for corner in itertools.product((0, 1), repeat=nd):
        # the weight of a corner is the product of the distances to the opposite corner
        tap_w.append(math.prod(c - lo if k else lo + 1 - c for c, lo, k in zip(coords, low, corner)))
        taps.append([(lo + k).astype(jnp.int32) for lo, k in zip(low, corner)])
    return _weighted_taps(rows, taps, tap_w, sizes, out_shape)


@register(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def grid_sampler(x, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(x, grid.astype(x.dtype), interpolation_mode, padding_mode, bool(align_corners))


@register(aten.grid_sampler.default)
def grid_sampler_any(x, grid, interpolation_mode, padding_mode, align_corners):
    return grid_sampler(x, grid, interpolation_mode, padding_mode, align_corners)
