"""Tensor factories (full, zeros, empty, arange, linspace, eye, tril) and dtype casts / copies."""
from __future__ import annotations

import platform
from typing import Any, Sequence

import jax.numpy as jnp
from jax import core
from jax import lax
from jax.export import is_symbolic_dim
import numpy as np
import torch

from dycl_jax.errors import DyclError
from dycl_jax.lower.dtypes import check_int32, int64
from dycl_jax.lower.ops._util import aten, jdtype
from dycl_jax.lower.registry import register


def _shape(size: Sequence[Any], op: str) -> tuple[Any, ...]:
    """A shape XLA knows when the graph is traced: ints, or `jax.export` symbolic dimensions
    (a size read from an input's symbolic shape, as an exported dispatch region has)."""
    dims = tuple(size) if isinstance(size, (list, tuple)) else (size,)
    for d in dims:
        if not isinstance(d, (int, np.integer)) and not is_symbolic_dim(d):
            raise DyclError(
                f"{op} got a size computed from tensor values ({type(d).__name__}); "
                "JAX arrays need sizes known at trace time",
                fix="derive the size from input shapes (x.shape[i]) instead of from tensor data",
            )
    return tuple(d if is_symbolic_dim(d) else int(d) for d in dims)


def _default_dtype(fill: Any) -> Any:
    """torch's dtype for a factory without dtype=: from the fill value's Python type."""
    if isinstance(fill, bool):
        return jnp.bool_
    if isinstance(fill, int):
        return int64()  # torch.int64 under dycl_jax's int64 policy
    if isinstance(fill, complex):
        return jnp.complex64
    if hasattr(fill, "dtype"):
        return fill.dtype
    return jnp.float32


def _fill(value: Any, dtype: Any, op: str) -> Any:
    """The fill value in `dtype`, refusing integers that int32 cannot hold."""
    if hasattr(value, "dtype"):
        return value.astype(dtype)
    if isinstance(value, int) and not isinstance(value, bool):
        if jnp.issubdtype(dtype, jnp.integer):
            check_int32(value, f"{op} fill value")
        elif dtype != jnp.bool_:
            value = float(value)
    return value


def _full(size: Any, value: Any, dtype: Any, op: str) -> Any:
    return jnp.full(_shape(size, op), _fill(value, dtype, op), dtype)


@register(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, fill_value, jdtype(dtype) or _default_dtype(fill_value), "full")


@register(aten.full_like.default)
def full_like(x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _full(x.shape, fill_value, jdtype(dtype) or x.dtype, "full_like")


@register(aten.new_full.default)
def new_full(x, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, fill_value, jdtype(dtype) or x.dtype, "new_full")


@register(aten.zeros.default)
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, 0, jdtype(dtype) or jnp.float32, "zeros")


@register(aten.ones.default)
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, 1, jdtype(dtype) or jnp.float32, "ones")


@register(aten.zeros_like.default)
def zeros_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _full(x.shape, 0, jdtype(dtype) or x.dtype, "zeros_like")


@register(aten.ones_like.default)
def ones_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _full(x.shape, 1, jdtype(dtype) or x.dtype, "ones_like")


@register(aten.new_zeros.default)
def new_zeros(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, 0, jdtype(dtype) or x.dtype, "new_zeros")


@register(aten.new_ones.default)
def new_ones(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, 1, jdtype(dtype) or x.dtype, "new_ones")


# Uninitialised tensors: torch promises no values, and a program that reads them before
# writing is undefined in torch, so any content is correct. Zeros are deterministic (the
# converted model gives the same result on every call) and XLA needs some value anyway.
@register(aten.empty.memory_format)
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _full(size, 0, jdtype(dtype) or jnp.float32, "empty")


@register(aten.empty_strided.default)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, 0, jdtype(dtype) or jnp.float32, "empty_strided")  # strides: XLA owns layout


@register(aten.empty_permuted.default)
def empty_permuted(size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, 0, jdtype(dtype) or jnp.float32, "empty_permuted")


@register(aten.empty_like.default)
def empty_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _full(x.shape, 0, jdtype(dtype) or x.dtype, "empty_like")


@register(aten.new_empty.default)
def new_empty(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, 0, jdtype(dtype) or x.dtype, "new_empty")


@register(aten.new_empty_strided.default)
def new_empty_strided(x, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full(size, 0, jdtype(dtype) or x.dtype, "new_empty_strided")


@register(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _full((), s, jdtype(dtype) or jnp.float32, "scalar_tensor")


@register(aten.fill.Scalar, aten.fill.Tensor)
def fill(x, value):
    return _full(x.shape, value, x.dtype, "fill")


@register(aten.zero.default)
def zero(x):
    return jnp.zeros_like(x)


# ---------------------------------------------------------------------------- ranges
def _number(v: Any, op: str) -> Any:
    if isinstance(v, bool):  # a Python bool bound counts as 0 or 1, as in torch
        return int(v)
    if isinstance(v, (int, float, np.integer, np.floating)) or is_symbolic_dim(v):
        return v
    raise DyclError(
        f"{op} got a bound computed from tensor values ({type(v).__name__}); its length must be "
        "known when the graph is traced",
        fix="derive range bounds from input shapes or Python numbers, not from tensor data",
    )


def _c_div(a: int, b: int) -> int:
    """C's integer division (toward zero), as torch's int64 kernel divides."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


@register(aten.arange.default, aten.arange.start, aten.arange.start_step)
def arange(*args, dtype=None, layout=None, device=None, pin_memory=None):
    bounds = [_number(v, "arange") for v in args]
    start, end, step = (0, bounds[0], 1) if len(bounds) == 1 else (*bounds, 1)[:3]
    if any(is_symbolic_dim(v) for v in (start, end, step)):
        return _symbolic_arange(start, end, step, dtype)
    integral = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
    out_dtype = jdtype(dtype) or (int64() if integral else jnp.float32)
    if not jnp.issubdtype(out_dtype, jnp.integer):
        # torch computes start + i * step in double and rounds once to the output dtype
        n = max(int(np.ceil((end - start) / step)), 0)
        return jnp.asarray((start + np.arange(n, dtype=np.float64) * step).astype(out_dtype))
    # torch's integer kernel truncates the bounds to int64 first and counts from those; its
    # length comes from the truncated bounds in int64 arithmetic for an int64 result, from the
    # unrounded ones in double for the other integer dtypes (arange(-0.9, 2.1, 2.0) is [0, 2])
    xstart, xend, xstep = (int(np.trunc(v)) for v in (start, end, step))
    if xstep == 0:
        raise DyclError("arange's step rounds to 0 in an integer dtype (torch refuses it too)",
                        fix="give an integer step other than 0")
    if dtype in (None, torch.int64):
        sign = (xstep > 0) - (xstep < 0)
        n = max(_c_div(xend - xstart + xstep - sign, xstep), 0)
    else:
        n = max(int(np.ceil((end - start) / step)), 0)
    check_int32(xstart, "arange start")
    check_int32(xstart + xstep * max(n - 1, 0), "arange end")
    return xstart + xstep * jnp.arange(n, dtype=out_dtype)


def _symbolic_arange(start: Any, end: Any, step: Any, dtype: Any) -> Any:
    """arange over a symbolic size (`torch.arange(x.size(1))` in an exported region): integer
    bounds only, so the length is exact symbolic arithmetic; the step must be a known int."""
    if not all(isinstance(v, (int, np.integer)) or is_symbolic_dim(v) for v in (start, end)) \
            or not isinstance(step, (int, np.integer)) or step == 0:
        raise DyclError("arange over a symbolic size takes integer bounds and a nonzero integer step",
                        fix="give arange integer bounds derived from input shapes")
    out_dtype = jdtype(dtype) or int64()
    if step > 0:  # ceil((end - start) / step), at least 0, as torch's int64 kernel counts
        n = core.max_dim((end - start + step - 1) // step, 0)
    else:
        n = core.max_dim((start - end - step - 1) // -step, 0)
    index = jnp.arange(n, dtype=out_dtype if jnp.issubdtype(out_dtype, jnp.integer) else jnp.int32)
    return (start + step * index).astype(out_dtype)


@register(aten.linspace.default)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    out_dtype = jdtype(dtype) or jnp.float32
    start, end = _number(start, "linspace"), _number(end, "linspace")
    steps = int(_number(steps, "linspace"))
    if steps == 1:
        return jnp.full((1,), start, out_dtype)
    # torch's kernel: the first half counts up from start, the second half down from end,
    # so both ends are exact; integer outputs are computed in double and truncated
    calc = np.float32
    if jnp.issubdtype(out_dtype, jnp.integer):
        calc, start, end = np.float64, int(start), int(end)  # bounds become integers first
    i = np.arange(steps, dtype=calc)
    step = (calc(end) - calc(start)) / calc(max(steps - 1, 1))
    values = np.where(i < steps // 2, calc(start) + step * i, calc(end) - step * (steps - 1 - i))
    return jnp.asarray(values.astype(out_dtype))


@register(aten.eye.default, aten.eye.m)
def eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    cols = None if m is None else int(_number(m, "eye"))
    return jnp.eye(int(_number(n, "eye")), cols, dtype=jdtype(dtype) or jnp.float32)


@register(aten.tril.default)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@register(aten.triu.default)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


# ---------------------------------------------------------------------------- casts, copies
# torch's CPU kernels convert float → int with the C cast, whose result outside the target's
# range (NaN and ±inf included) is the machine's: x86 gives the "integer indefinite" value, the
# most negative int; ARM saturates (NaN → 0), as XLA does everywhere
_INDEFINITE = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


@register(aten._to_copy.default)
def to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    # float → int truncates toward zero and any → bool tests != 0, in torch and in XLA alike
    if dtype is None:
        return x
    target = jdtype(dtype)
    if jnp.issubdtype(x.dtype, jnp.floating) and (jnp.issubdtype(target, jnp.signedinteger) or target == jnp.uint8):
        return _float_to_int(x, target)
    return x.astype(target)


def _float_to_int(x, target):
    """torch's float → signed int (or uint8) cast: truncation toward zero; narrow targets go
    through a 32-bit int and keep its low bits (-1.0 → 255 as uint8), where XLA would saturate;
    values outside the (32-bit) range follow this machine's C cast (see _INDEFINITE)."""
    via = jnp.int32 if target in (jnp.uint8, jnp.int8, jnp.int16) else target
    out = x.astype(via)
    if _INDEFINITE:
        low = int(jnp.iinfo(via).min)
        # -2^31 and -2^63 are exact in every float dtype; a float16 bound rounds to -inf, and
        # every finite float16 is in range, so the test stays right; NaN fails both sides
        inside = (x >= float(low)) & (x < -float(low))
        out = jnp.where(inside, out, jnp.asarray(low, via))
    return out if via == target else out.astype(target)


@register(torch.ops.prims.convert_element_type.default)
def convert_element_type(x, dtype):
    # torch's decompositions of some half-precision ops (renorm) cast through this prim
    return to_copy(x, dtype=dtype)


@register(aten.clone.default)
def clone(x, *, memory_format=None):
    return x  # JAX arrays are immutable: a clone needs no copy


@register(aten.lift_fresh_copy.default)
def lift_fresh_copy(x):
    return x


@register(aten.detach.default)
def detach(x):
    return lax.stop_gradient(x)  # torch autograd does not flow through detach, nor jax.grad here


@register(aten.copy.default)
def copy(x, src, non_blocking=False):
    # copy_ into x: src broadcast to x's shape in x's dtype
    return jnp.broadcast_to(jnp.asarray(src).astype(x.dtype), x.shape)
