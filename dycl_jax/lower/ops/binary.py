"""Elementwise binary ops: arithmetic, division modes, pow, comparisons, logic, where and clamp."""
from __future__ import annotations

import functools
import operator
from typing import Any, Callable

import jax.numpy as jnp
import numpy as np
from jax import lax

from dycl_jax.lower.dtypes import INT32_MAX, INT32_MIN
from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.ops.elementwise import is_float, is_int, operands, scalar_for, to_float
from dycl_jax.lower.registry import register


_HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def _opmath(fn: Callable) -> Callable:
    """A half-precision array meeting a Python number (or an `alpha`) is computed in float32 and
    rounded once, as torch's kernels do (their opmath type): rounding the scalar to float16
    first would turn `x / 70000.0` into `x / inf`, or drop a scale below float16's resolution.
    `alpha` alone is rounded to the tensor's dtype first, as torch does."""
    @functools.wraps(fn)
    def wrapped(a: Any, b: Any, **kwargs: Any) -> Any:
        arrays = [v for v in (a, b) if hasattr(v, "dtype")]
        kinds = {v.dtype for v in arrays}
        number = len(arrays) == 1 and not isinstance(a if arrays[0] is b else b, bool)
        if not (len(kinds) == 1 and kinds <= set(_HALF) and (number or kwargs.get("alpha") not in (None, 1))):
            return fn(a, b, **kwargs)
        half = kinds.pop()
        if kwargs.get("alpha") is not None:  # torch rounds alpha to the tensor's dtype (not the other scalar)
            kwargs["alpha"] = float(np.asarray(kwargs["alpha"], dtype=half).astype(np.float32))
        up = [v.astype(jnp.float32) if hasattr(v, "dtype") else v for v in (a, b)]
        return fn(*up, **kwargs).astype(half)
    return wrapped


def _alpha(b: Any, alpha: Any) -> Any:
    if alpha is None or alpha == 1:
        return b
    return b * (scalar_for(alpha, b) if hasattr(b, "dtype") else alpha)


# ---------------------------------------------------------------------------- arithmetic
@register(aten.add.Tensor, aten.add.Scalar)
@_opmath
def add(a, b, *, alpha=None):
    a, b = operands(a, b)
    return a + _alpha(b, alpha)


@register(aten.sub.Tensor, aten.sub.Scalar)
@_opmath
def sub(a, b, *, alpha=None):
    a, b = operands(a, b)
    return a - _alpha(b, alpha)


@register(aten.rsub.Tensor, aten.rsub.Scalar)
@_opmath
def rsub(a, b, *, alpha=None):
    a, b = operands(a, b)
    return b - _alpha(a, alpha)


@register(aten.mul.Tensor, aten.mul.Scalar)
@_opmath
def mul(a, b):
    a, b = operands(a, b)
    return a * b


def _floats(a: Any, b: Any) -> tuple[Any, Any]:
    # true division always produces floats in torch, so Python ints never meet int32 here
    a = to_float(a) if hasattr(a, "dtype") else float(a)
    b = to_float(b) if hasattr(b, "dtype") else float(b)
    return a, b


@register(aten.div.Tensor, aten.div.Scalar, aten.true_divide.Tensor)
@_opmath
def div(a, b):
    a, b = _floats(a, b)
    kinds = {v.dtype for v in (a, b) if hasattr(v, "dtype")}
    if len(kinds) == 1 and kinds <= set(_HALF):
        # XLA's vectorised float16 division on CPU can be 1 ulp off (138.95 -> 138.875), which
        # `trunc` mode turns into a whole unit; torch divides in float32 and rounds once
        half = kinds.pop()
        return jnp.true_divide(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)).astype(half)
    return jnp.true_divide(a, b)


def _trunc_div_int(a: Any, b: Any) -> Any:
    # lax.div on integers rounds toward zero (C semantics), which is torch's "trunc" mode
    a, b = jnp.asarray(a), jnp.asarray(b)
    dtype = jnp.result_type(a, b)
    a, b = jnp.broadcast_arrays(a.astype(dtype), b.astype(dtype))
    return lax.div(a, b)


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(a, b, *, rounding_mode=None):
    if rounding_mode is None:
        return div(a, b)
    a, b = operands(a, b)
    integral = not is_float(jnp.asarray(a)) and not is_float(jnp.asarray(b))
    if rounding_mode == "trunc":
        return _trunc_div_int(a, b) if integral else jnp.trunc(div(a, b))
    if rounding_mode == "floor":
        # jnp.floor_divide follows Python's floor division for ints and floats, as torch does
        return jnp.floor_divide(a, b)
    raise ValueError(f"unknown rounding_mode {rounding_mode!r}")


@register(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(a, b):
    a, b = operands(a, b)
    return jnp.floor_divide(a, b)


@register(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(a, b):
    a, b = operands(a, b)
    return jnp.remainder(a, b)  # sign of the divisor, like Python's %


@register(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(a, b):
    a, b = operands(a, b)
    return jnp.fmod(a, b)  # sign of the dividend, like C's fmod


@register(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def pow_(a, b):
    a, b = operands(a, b)
    if not isinstance(b, (int, float)) and jnp.issubdtype(jnp.result_type(a, b), jnp.integer):
        return _int_pow(a, b)
    # a Python int exponent lowers to lax.integer_pow (repeated multiplication), as torch does
    return jnp.power(a, b)


def _int_pow(a, b):
    """Integer powers with a tensor exponent: a negative exponent gives 0, except for the bases 1
    (1) and -1 (+-1 by the exponent's parity), as torch's integer pow; jnp wraps instead."""
    dt = jnp.result_type(a, b)
    a, b = jnp.asarray(a, dt), jnp.asarray(b, dt)
    negative = jnp.where(a == 1, 1, jnp.where(a == -1, 1 - 2 * (b & 1), 0)).astype(dt)
    return jnp.where(b < 0, negative, jnp.power(a, jnp.maximum(b, 0)))


@register(aten.atan2.default)
def atan2(a, b):
    return jnp.arctan2(to_float(a), to_float(b))


@register(aten.hypot.default)
def hypot(a, b):
    return jnp.hypot(to_float(a), to_float(b))


@register(aten.copysign.Tensor, aten.copysign.Scalar)
def copysign(a, b):
    a, b = _floats(a, b)
    return jnp.copysign(a, b)


@register(aten.nextafter.default)
def nextafter(a, b):
    return jnp.nextafter(a, b)


@register(aten.ldexp.Tensor)
def ldexp(a, b):
    return to_float(a) * jnp.exp2(to_float(b))


@register(aten.gcd.default)
def gcd(a, b):
    return jnp.gcd(a, b)


@register(aten.lcm.default)
def lcm(a, b):
    return jnp.lcm(a, b)


@register(aten.maximum.default)
def maximum(a, b):
    return jnp.maximum(a, b)  # propagates NaN, like torch


@register(aten.minimum.default)
def minimum(a, b):
    return jnp.minimum(a, b)


@register(aten.fmax.default)
def fmax(a, b):
    return jnp.fmax(a, b)  # ignores NaN unless both are NaN


@register(aten.fmin.default)
def fmin(a, b):
    return jnp.fmin(a, b)


@register(aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other)
def xlogy(a, b):
    a, b = _floats(a, b)
    a, b = jnp.asarray(a), jnp.asarray(b)
    out = jnp.where(a == 0, jnp.zeros_like(a * b), a * jnp.log(b))
    return jnp.where(jnp.isnan(b), jnp.full_like(out, jnp.nan), out)


@register(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(start, end, weight):
    # torch's two-sided formula: exact at weight 0 and 1
    diff = end - start
    return jnp.where(jnp.abs(weight) < 0.5, start + weight * diff, end - diff * (1 - weight))


@register(aten.addcmul.default)
def addcmul(x, t1, t2, *, value=1):
    return x + value * t1 * t2


@register(aten.addcdiv.default)
def addcdiv(x, t1, t2, *, value=1):
    return x + value * (t1 / t2)


# ---------------------------------------------------------------------------- shifts, bitwise
def _shift(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def lower(a, b):
        a, b = operands(a, b)
        a, b = jnp.asarray(a), jnp.asarray(b)
        dtype = jnp.result_type(a, b)
        # shifts of `bits` or more (or negative) give 0 / the sign fill in both torch and XLA
        return fn(a.astype(dtype), b.astype(dtype))

    return lower


for _ov in ("Tensor", "Tensor_Scalar", "Scalar_Tensor"):
    register(getattr(aten.bitwise_left_shift, _ov))(_shift(jnp.left_shift))
    register(getattr(aten.bitwise_right_shift, _ov))(_shift(jnp.right_shift))
# `x << 2` on a tensor records the dunder overloads
register(aten.__lshift__.Tensor, aten.__lshift__.Scalar)(_shift(jnp.left_shift))
register(aten.__rshift__.Tensor, aten.__rshift__.Scalar)(_shift(jnp.right_shift))


def _bitwise(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def lower(a, b):
        a, b = operands(a, b)
        return fn(a, b)

    return lower


for _name, _fn in (("bitwise_and", jnp.bitwise_and), ("bitwise_or", jnp.bitwise_or), ("bitwise_xor", jnp.bitwise_xor)):
    _pk = getattr(aten, _name)
    register(_pk.Tensor, _pk.Scalar, _pk.Scalar_Tensor)(_bitwise(_fn))

register(aten.logical_and.default)(jnp.logical_and)
register(aten.logical_or.default)(jnp.logical_or)
register(aten.logical_xor.default)(jnp.logical_xor)


# ---------------------------------------------------------------------------- comparisons
def _compare(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def lower(a, b):
        for x, s, flip in ((a, b, False), (b, a, True)):
            # an int beyond int32 next to an int32 (torch: int64) tensor: torch compares
            # exactly and the answer is the same for every element, so compare it against any
            # representable value instead of overflowing. (Narrower ints wrap the scalar to
            # their dtype in torch, and JAX's weak typing does the same.)
            if hasattr(x, "dtype") and x.dtype == jnp.int32 and isinstance(s, int) and not isinstance(s, bool):
                if not INT32_MIN <= s <= INT32_MAX:
                    const = fn(s, 0) if flip else fn(0, s)
                    return jnp.full(jnp.shape(x), const, jnp.bool_)
        a, b = operands(a, b)
        return fn(a, b)

    return lower


for _name, _fn in (
    ("eq", operator.eq),
    ("ne", operator.ne),
    ("lt", operator.lt),
    ("le", operator.le),
    ("gt", operator.gt),
    ("ge", operator.ge),
):
    _pk = getattr(aten, _name)
    register(_pk.Tensor, _pk.Scalar)(_compare(_fn))


# ---------------------------------------------------------------------------- where, clamp
@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(cond, a, b):
    a, b = operands(a, b)
    return jnp.where(cond, a, b)


def _bound(value: Any, x: Any) -> Any:
    if value is None or hasattr(value, "dtype"):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and is_int(x):
        # a bound beyond the dtype's range clamps nothing (or everything to the other end),
        # so saturating it keeps the result exact where JAX would wrap or overflow
        info = jnp.iinfo(x.dtype)
        return min(max(value, int(info.min)), int(info.max))
    return scalar_for(value, x)


def clamp_between(x: Any, lo: Any, hi: Any) -> Any:
    lo, hi = _bound(lo, x), _bound(hi, x)
    # max then min: NaN in x or in a bound propagates and lo > hi yields hi, as in torch
    if lo is not None:
        x = jnp.maximum(x, lo)
    if hi is not None:
        x = jnp.minimum(x, hi)
    return x


@register(aten.clamp.default, aten.clamp.Tensor)
def clamp(x, min=None, max=None):  # noqa: A002 (ATen argument names)
    return clamp_between(x, min, max)


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(x, min):  # noqa: A002
    return clamp_between(x, min, None)


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(x, max):  # noqa: A002
    return clamp_between(x, None, max)
