"""Upsampling: nearest, nearest-exact, (bi/tri)linear and bicubic, with torch's index maths."""
from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register

# Output sizes and source positions depend only on static spatial sizes, so every table is
# numpy computed while tracing. Positions are computed in float32, as torch's CPU kernels do,
# so that nearest-neighbour rounding picks the same pixels.
_F32 = np.float32
_CUBIC_A = -0.75  # torch's bicubic coefficient


def _resolve(x, n: int, output_size, scales) -> tuple[list[int], list[float | None]]:
    """Output sizes and per-axis scale factors from either overload family."""
    sizes = x.shape[-n:]
    scales = list(scales) if scales is not None else [None] * n
    if len(scales) == 1 and n > 1:
        scales = scales * n
    if output_size is not None:
        return [int(o) for o in output_size], scales
    # `.vec` with scale factors: torch floors size * scale in double precision
    return [int(np.floor(s * f)) for s, f in zip(sizes, scales)], scales


def _area_scale(in_size: int, out_size: int, align_corners: bool, scale: float | None) -> _F32:
    if align_corners:
        return _F32((in_size - 1) / (out_size - 1)) if out_size > 1 else _F32(0)
    return _F32(1.0 / scale) if scale is not None and scale > 0 else _F32(in_size / out_size)


def _source(in_size, out_size, align_corners, scale, cubic: bool) -> np.ndarray:
    s = _area_scale(in_size, out_size, align_corners, scale)
    dst = np.arange(out_size, dtype=_F32)
    if align_corners:
        return s * dst
    src = s * (dst + _F32(0.5)) - _F32(0.5)
    return src if cubic else np.maximum(src, _F32(0))


def _nearest_table(in_size, out_size, scale, exact: bool):
    s = _F32(in_size / (in_size * scale)) if scale is not None and scale > 0 else _F32(in_size / out_size)
    dst = np.arange(out_size, dtype=_F32) + (_F32(0.5) if exact else _F32(0))
    idx = np.minimum(np.floor(dst * s).astype(np.int64), in_size - 1)
    return idx[:, None], None


def _linear_table(in_size, out_size, align_corners, scale):
    if in_size == out_size and not align_corners:
        return np.arange(out_size)[:, None], None  # torch copies the input unchanged
    src = _source(in_size, out_size, align_corners, scale, cubic=False)
    i0 = src.astype(np.int64)  # src >= 0, so truncation is floor
    i1 = np.minimum(i0 + 1, in_size - 1)
    lam = np.clip(src - i0.astype(_F32), 0, 1).astype(_F32)
    return np.stack([i0, i1], 1), np.stack([_F32(1) - lam, lam], 1)


def _cubic_weights(t: np.ndarray) -> np.ndarray:
    a = _F32(_CUBIC_A)

    def near(u):  # |u| <= 1
        return ((a + 2) * u - (a + 3)) * u * u + 1

    def far(u):  # 1 < |u| < 2
        return ((a * u - 5 * a) * u + 8 * a) * u - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], 1).astype(_F32)


def _cubic_table(in_size, out_size, align_corners, scale):
    src = _source(in_size, out_size, align_corners, scale, cubic=True)
    i0 = np.floor(src).astype(np.int64)
    t = (src - i0.astype(_F32)).astype(_F32)
    idx = np.clip(i0[:, None] + np.arange(-1, 3)[None, :], 0, in_size - 1)  # edge taps repeat
    return idx, _cubic_weights(t)


def _apply_tables(x, tables):
    """Resample axis by axis: out[..., o, ...] = Σ_t w[o, t] · x[..., idx[o, t], ...]."""
    n = len(tables)
    floating = jnp.issubdtype(x.dtype, jnp.floating)
    for ax, (idx, w) in enumerate(tables):
        axis = x.ndim - n + ax
        if w is None:  # nearest: a pure gather, exact for every dtype
            x = _take(x, idx[:, 0], axis)
            continue
        if not floating:
            x = x.astype(jnp.float32)
            floating = True
        acc = x.dtype if x.dtype.itemsize >= 4 else jnp.float32
        shape = [1] * x.ndim
        shape[axis] = w.shape[0]
        # one 1-D gather per tap, summed in tap order: XLA:CPU runs a gather with a 2-D index
        # table (output, tap) about 70x slower than these
        out = None
        for t in range(w.shape[1]):
            term = _take(x, idx[:, t], axis).astype(acc) * jnp.asarray(w[:, t].reshape(shape), acc)
            out = term if out is None else out + term
        x = out
    return x


def _take(x, idx: np.ndarray, axis: int):
    # the tables index inside the array by construction: "clip" skips the out-of-bounds fill masks
    return jnp.take(x, jnp.asarray(idx.astype(np.int32)), axis=axis, mode="clip")


def _nearest(x, n, output_size, scales, exact=False):
    outs, scales = _resolve(x, n, output_size, scales)
    tables = [_nearest_table(i, o, s, exact) for i, o, s in zip(x.shape[-n:], outs, scales)]
    return _apply_tables(x, tables)


def _interp(x, n, output_size, align_corners, scales, table_fn):
    outs, scales = _resolve(x, n, output_size, scales)
    tables = [table_fn(i, o, align_corners, s) for i, o, s in zip(x.shape[-n:], outs, scales)]
    return _apply_tables(x, tables)


# --- nearest / nearest-exact ---------------------------------------------------------------
@register(aten.upsample_nearest1d.vec, aten.upsample_nearest2d.vec, aten.upsample_nearest3d.vec)
def upsample_nearest_vec(x, output_size: Sequence[int] | None, scale_factors: Sequence[float] | None):
    n = len(output_size) if output_size is not None else len(scale_factors)
    return _nearest(x, n, output_size, scale_factors)


@register(
    aten._upsample_nearest_exact1d.vec, aten._upsample_nearest_exact2d.vec, aten._upsample_nearest_exact3d.vec
)
def upsample_nearest_exact_vec(x, output_size, scale_factors):
    n = len(output_size) if output_size is not None else len(scale_factors)
    return _nearest(x, n, output_size, scale_factors, exact=True)


@register(aten.upsample_nearest1d.default, aten.upsample_nearest2d.default, aten.upsample_nearest3d.default)
def upsample_nearest(x, output_size, *scales):
    return _nearest(x, len(output_size), output_size, _pad_scales(scales, len(output_size)))


@register(
    aten._upsample_nearest_exact1d.default,
    aten._upsample_nearest_exact2d.default,
    aten._upsample_nearest_exact3d.default,
)
def upsample_nearest_exact(x, output_size, *scales):
    return _nearest(x, len(output_size), output_size, _pad_scales(scales, len(output_size)), exact=True)


def _pad_scales(scales: Sequence[float | None], n: int) -> list[float | None]:
    return list(scales) + [None] * (n - len(scales))


# --- linear / bilinear / trilinear / bicubic -----------------------------------------------
@register(aten.upsample_linear1d.vec, aten.upsample_bilinear2d.vec, aten.upsample_trilinear3d.vec)
def upsample_linear_vec(x, output_size, align_corners, scale_factors):
    n = len(output_size) if output_size is not None else len(scale_factors)
    return _interp(x, n, output_size, align_corners, scale_factors, _linear_table)


@register(aten.upsample_linear1d.default, aten.upsample_bilinear2d.default, aten.upsample_trilinear3d.default)
def upsample_linear(x, output_size, align_corners, *scales):
    n = len(output_size)
    return _interp(x, n, output_size, align_corners, _pad_scales(scales, n), _linear_table)


@register(aten.upsample_bicubic2d.vec)
def upsample_bicubic2d_vec(x, output_size, align_corners, scale_factors):
    return _interp(x, 2, output_size, align_corners, scale_factors, _cubic_table)


@register(aten.upsample_bicubic2d.default)
def upsample_bicubic2d(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _interp(x, 2, output_size, align_corners, [scales_h, scales_w], _cubic_table)
