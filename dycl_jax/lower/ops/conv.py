"""Convolution: aten.convolution (1d/2d/3d, grouped, dilated, transposed) via lax, with faster
formulations for the shapes XLA:CPU handles poorly (see `_forward`)."""
from __future__ import annotations

import itertools
import math
from typing import Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register

Array = jnp.ndarray
Ints = Sequence[int]

# XLA:CPU hands a 2-D float32 convolution to YNNPACK only when max(in, out channels) > 16;
# smaller ones run Eigen's spatial convolution, 3-5x slower (measured with scripts/bench.py).
_YNN_MIN_CHANNELS = 17
_YNN_PADDED_CHANNELS = 24
# im2col materialises k·k copies of the input: worth it only while that stays small.
_IM2COL_MAX_CIN = 4
# Up to this many patch elements (batch 1 stems) the patches are gathered in one kernel.
_GATHER_MAX_PATCH = 1 << 16
# Depthwise as k·k shifted multiply-adds: one fused loop, unrolled per kernel tap.
_DEPTHWISE_MAX_TAPS = 64


def expand_ints(value: Sequence[int] | int, n: int, what: str) -> tuple[int, ...]:
    """ATen int lists may hold one value for all spatial dims; return exactly `n` ints."""
    vals = (value,) if isinstance(value, int) else tuple(int(v) for v in value)
    if len(vals) == 1:
        return vals * n
    if len(vals) != n:
        raise ValueError(f"{what} has {len(vals)} values for {n} spatial dims")
    return vals


def _channels_last(n: int) -> tuple[str, str, str]:
    # input/output N,spatial...,C; weight spatial...,I,O (the transposes are in _lax_conv)
    sp = "DHW"[3 - n:] if n <= 3 else "".join(chr(ord("a") + i) for i in range(n))
    return ("N" + sp + "C", sp + "IO", "N" + sp + "C")


def _transposed_weight(w: jnp.ndarray, groups: int) -> jnp.ndarray:
    """Turn a (Cin, Cout/g, k...) transposed-conv weight into the (Cout, Cin/g, k...) forward
    weight of the equivalent dilated convolution, with every spatial axis flipped."""
    cin, cout_g, *ks = w.shape
    w = w.reshape(groups, cin // groups, cout_g, *ks)
    w = jnp.swapaxes(w, 1, 2).reshape(groups * cout_g, cin // groups, *ks)
    return jnp.flip(w, axis=tuple(range(2, 2 + len(ks))))


def _lax_conv(
    x: Array, w: Array, stride: Ints, pads: list[tuple[int, int]], dilation: Ints, groups: int,
    lhs_dilation: Ints | None = None,
) -> Array:
    """lax's convolution on torch-layout arrays, computed channels-last.

    XLA:CPU only has fast kernels for channels-last convolutions. At top level its layout
    pass turns an NCHW convolution into one, but not inside lax.cond branches, where an
    NCHW convolution runs a naive loop (~10x slower); stating the transposes here makes
    every convolution canonical, and XLA drops transposes that cancel out.
    """
    n = w.ndim - 2
    to_last = (0,) + tuple(range(2, n + 2)) + (1,)
    out = lax.conv_general_dilated(
        jnp.transpose(x, to_last),
        jnp.transpose(w, tuple(range(2, n + 2)) + (1, 0)),
        window_strides=stride,
        padding=pads,
        lhs_dilation=lhs_dilation,
        rhs_dilation=dilation,
        dimension_numbers=_channels_last(n),
        feature_group_count=groups,
    )
    return jnp.transpose(out, (0, n + 1) + tuple(range(1, n + 1)))


def _taps(x: Array, ks: Ints, stride: Ints, padding: Ints, dilation: Ints) -> list[Array]:
    """For every kernel tap (in weight order), the strided window of the zero-padded input
    it multiplies: a list of (N, C, out spatial...) arrays."""
    xp = jnp.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    out = [(xp.shape[2 + i] - d * (k - 1) - 1) // s + 1 for i, (k, s, d) in enumerate(zip(ks, stride, dilation))]
    taps = []
    for idx in itertools.product(*(range(k) for k in ks)):
        start = (0, 0) + tuple(i * d for i, d in zip(idx, dilation))
        limit = xp.shape[:2] + tuple(b + (o - 1) * s + 1 for b, o, s in zip(start[2:], out, stride))
        taps.append(lax.slice(xp, start, limit, (1, 1) + tuple(stride)))
    return taps


def _depthwise(x: Array, w: Array, stride: Ints, padding: Ints, dilation: Ints) -> Array:
    # XLA:CPU runs feature-grouped convolutions 5-10x slower than this elementwise form,
    # which XLA fuses into one loop over the output.
    n = w.ndim - 2
    out = None
    for tap, idx in zip(_taps(x, w.shape[2:], stride, padding, dilation), itertools.product(*map(range, w.shape[2:]))):
        term = tap * w[(slice(None), 0) + idx].reshape((1, -1) + (1,) * n)
        out = term if out is None else out + term
    return out


def _pointwise(x: Array, w: Array, stride: Ints) -> Array:
    # a 1x1 convolution is a matrix product over channels (YNNPACK's dot, no layout copies)
    if any(s != 1 for s in stride):
        x = x[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in stride)]
    return jnp.einsum("nc...,oc->no...", x, w.reshape(w.shape[:2]))


def _im2col(x: Array, w: Array, stride: Ints, padding: Ints, dilation: Ints) -> Array:
    # Few input channels (an RGB stem): Eigen's and YNNPACK's convolutions are slow, a single
    # matrix product over (Cin·k·k, N·out) patches is not. Rows are built channel-major so
    # that building them is a few block copies.
    n, cin = x.shape[:2]
    cout, ks = w.shape[0], w.shape[2:]
    xc = jnp.swapaxes(x, 0, 1)  # (Cin, N, spatial...)
    out_sp = tuple((x.shape[2 + i] + 2 * p - d * (k - 1) - 1) // s + 1
                   for i, (k, s, p, d) in enumerate(zip(ks, stride, padding, dilation)))
    if cin * math.prod(ks) * n * math.prod(out_sp) <= _GATHER_MAX_PATCH:
        patches = _gathered_patches(xc, ks, stride, padding, dilation, out_sp)
    else:
        patches = jnp.stack(_taps(xc, ks, stride, padding, dilation), axis=1)
    out = jnp.dot(w.reshape(cout, -1), patches.reshape(cin * math.prod(ks), -1))
    return jnp.swapaxes(out.reshape((cout, n) + out_sp), 0, 1)


def _gathered_patches(xc: Array, ks: Ints, stride: Ints, padding: Ints, dilation: Ints, out_sp: Ints) -> Array:
    """(Cin, k·k, N, out) patches as one gather: a single XLA kernel instead of one slice per
    tap. Small models pay per kernel (XLA may run independent kernels on another thread and
    wait for it), large patches pay for the gather's index arithmetic."""
    xp = jnp.pad(xc, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    grids = np.meshgrid(*(np.arange(k) for k in ks), *(np.arange(o) for o in out_sp), indexing="ij")
    m = len(ks)
    index = tuple(grids[i] * d + grids[m + i] * s for i, (s, d) in enumerate(zip(stride, dilation)))
    patches = xp[(slice(None), slice(None)) + index]  # (Cin, N, k..., out...)
    return jnp.moveaxis(patches, 1, 1 + m)  # (Cin, k..., N, out...)


def _forward(x: Array, w: Array, stride: Ints, padding: Ints, dilation: Ints, groups: int) -> Array:
    """A forward (not transposed) convolution, in the fastest exact form for its shape."""
    n = w.ndim - 2
    cin, cout, ks = x.shape[1], w.shape[0], w.shape[2:]
    if x.dtype != jnp.float32 or n < 1:  # the faster forms are measured for float32 only
        return _lax_conv(x, w, stride, [(p, p) for p in padding], dilation, groups)
    taps = math.prod(ks)
    if groups > 1 and groups == cin == cout and taps <= _DEPTHWISE_MAX_TAPS:
        return _depthwise(x, w, stride, padding, dilation)
    if groups != 1:
        return _lax_conv(x, w, stride, [(p, p) for p in padding], dilation, groups)
    if taps == 1 and not any(padding):
        return _pointwise(x, w, stride)
    if n != 2 or max(cin, cout) >= _YNN_MIN_CHANNELS:
        return _lax_conv(x, w, stride, [(p, p) for p in padding], dilation, groups)
    if cin <= _IM2COL_MAX_CIN:
        return _im2col(x, w, stride, padding, dilation)
    # zero output channels lift the conv over YNNPACK's threshold; they are sliced off again
    wp = jnp.pad(w, [(0, _YNN_PADDED_CHANNELS - cout)] + [(0, 0)] * (w.ndim - 1))
    return _lax_conv(x, wp, stride, [(p, p) for p in padding], dilation, groups)[:, :cout]


@register(aten.convolution.default)
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    n = weight.ndim - 2
    stride = expand_ints(stride, n, "stride")
    padding = expand_ints(padding, n, "padding")
    dilation = expand_ints(dilation, n, "dilation")
    # Compute in the weight's dtype family; mixed precision is resolved by the interpreter's cast.
    dtype = jnp.result_type(x.dtype, weight.dtype)
    x, weight = x.astype(dtype), weight.astype(dtype)
    if not transposed:
        out = _forward(x, weight, stride, padding, dilation, groups)
    else:
        # A transposed convolution is the gradient of a forward one: dilate the input by the
        # stride, pad by d*(k-1)-p (plus output_padding on the high side) and convolve with
        # the flipped kernel. Negative padding (p > d*(k-1)) crops, which lax accepts.
        output_padding = expand_ints(output_padding, n, "output_padding")
        ks = weight.shape[2:]
        pads = [
            (d * (k - 1) - p, d * (k - 1) - p + op)
            for k, p, d, op in zip(ks, padding, dilation, output_padding)
        ]
        out = _lax_conv(x, _transposed_weight(weight, groups), (1,) * n, pads, dilation, groups, lhs_dilation=stride)
    if bias is not None:
        out = out + bias.astype(out.dtype).reshape((1, -1) + (1,) * n)
    return out
