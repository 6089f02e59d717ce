"""Convolution: aten.convolution (1d/2d/3d, grouped, dilated, transposed) via lax.conv_general_dilated."""
from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
from jax import lax

from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register


def expand_ints(value: Sequence[int] | int, n: int, what: str) -> tuple[int, ...]:
    """ATen int lists may hold one value for all spatial dims; return exactly `n` ints."""
    vals = (value,) if isinstance(value, int) else tuple(int(v) for v in value)
    if len(vals) == 1:
        return vals * n
    if len(vals) != n:
        raise ValueError(f"{what} has {len(vals)} values for {n} spatial dims")
    return vals


def _dimension_numbers(n: int) -> tuple[str, str, str]:
    # torch's layouts: input/output N,C,spatial...; weight O,I,spatial... — no transposes needed.
    sp = "DHW"[3 - n:] if n <= 3 else "".join(chr(ord("a") + i) for i in range(n))
    return ("NC" + sp, "OI" + sp, "NC" + sp)


def _transposed_weight(w: jnp.ndarray, groups: int) -> jnp.ndarray:
    """Turn a (Cin, Cout/g, k...) transposed-conv weight into the (Cout, Cin/g, k...) forward
    weight of the equivalent dilated convolution, with every spatial axis flipped."""
    cin, cout_g, *ks = w.shape
    w = w.reshape(groups, cin // groups, cout_g, *ks)
    w = jnp.swapaxes(w, 1, 2).reshape(groups * cout_g, cin // groups, *ks)
    return jnp.flip(w, axis=tuple(range(2, 2 + len(ks))))


@register(aten.convolution.default)
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    n = weight.ndim - 2
    stride = expand_ints(stride, n, "stride")
    padding = expand_ints(padding, n, "padding")
    dilation = expand_ints(dilation, n, "dilation")
    dn = _dimension_numbers(n)
    # Compute in the weight's dtype family; mixed precision is resolved by the interpreter's cast.
    dtype = jnp.result_type(x.dtype, weight.dtype)
    x, weight = x.astype(dtype), weight.astype(dtype)
    if not transposed:
        out = lax.conv_general_dilated(
            x,
            weight,
            window_strides=stride,
            padding=[(p, p) for p in padding],
            rhs_dilation=dilation,
            dimension_numbers=dn,
            feature_group_count=groups,
        )
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
        out = lax.conv_general_dilated(
            x,
            _transposed_weight(weight, groups),
            window_strides=(1,) * n,
            padding=pads,
            lhs_dilation=stride,
            rhs_dilation=dilation,
            dimension_numbers=dn,
            feature_group_count=groups,
        )
    if bias is not None:
        out = out + bias.astype(out.dtype).reshape((1, -1) + (1,) * n)
    return out
