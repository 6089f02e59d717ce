"""Elementwise unary math (exp, log, trig, rounding, special functions) and scalar helpers."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from numpy.polynomial import polynomial as P

from dycl_jax.lower.dtypes import check_int32
from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register

# ---------------------------------------------------------------------------- helpers
# Shared by the binary, activation, reduction and creation lowerings of this family.


def is_float(x: Any) -> bool:
    """True for floating and complex arrays (torch's "floating point" for promotion)."""
    return jnp.issubdtype(x.dtype, jnp.inexact)


def is_bool(x: Any) -> bool:
    return x.dtype == jnp.bool_


def is_int(x: Any) -> bool:
    return jnp.issubdtype(x.dtype, jnp.integer)


def to_float(x: Any) -> Any:
    """Integer/bool arrays as float32: torch computes float math of integers in its default dtype."""
    x = jnp.asarray(x)
    return x if is_float(x) else x.astype(jnp.float32)


def scalar_for(value: Any, like: Any, what: str = "integer scalar") -> Any:
    """A Python scalar prepared to meet array `like` in a JAX op without overflowing int32.

    JAX parses Python ints as int32 even next to a float array, so ints go to float when the
    array is floating; next to an integer array an int outside int32 cannot be represented.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        return value
    if hasattr(like, "dtype") and is_float(like):
        return float(value)
    return check_int32(value, what)


def operands(a: Any, b: Any) -> tuple[Any, Any]:
    """Both operands of a binary op, with whichever one is a Python scalar made safe."""
    a_arr, b_arr = hasattr(a, "dtype"), hasattr(b, "dtype")
    if a_arr and not b_arr:
        return a, scalar_for(b, a)
    if b_arr and not a_arr:
        return scalar_for(a, b), b
    if not a_arr and not b_arr:  # rare (folded scalar math): make one side an array
        a = jnp.asarray(scalar_for(a, None))
        return a, scalar_for(b, a)
    return a, b


# ---------------------------------------------------------------------------- plain maps
# Ops whose torch and jnp/lax definitions agree, including NaN/inf handling.
_FLOAT_MATH = {
    aten.exp.default: jnp.exp,
    aten.exp2.default: jnp.exp2,
    aten.expm1.default: jnp.expm1,
    aten.log.default: jnp.log,
    aten.log2.default: jnp.log2,
    aten.log10.default: jnp.log10,
    aten.log1p.default: jnp.log1p,
    aten.sqrt.default: jnp.sqrt,
    aten.rsqrt.default: lax.rsqrt,
    aten.sin.default: jnp.sin,
    aten.cos.default: jnp.cos,
    aten.tan.default: jnp.tan,
    aten.asin.default: jnp.arcsin,
    aten.acos.default: jnp.arccos,
    aten.atan.default: jnp.arctan,
    aten.sinh.default: jnp.sinh,
    aten.cosh.default: jnp.cosh,
    aten.tanh.default: jnp.tanh,
    aten.asinh.default: jnp.arcsinh,
    aten.acosh.default: jnp.arccosh,
    aten.atanh.default: jnp.arctanh,
    aten.erf.default: lax.erf,
    aten.erfc.default: lax.erfc,
    aten.erfinv.default: lax.erf_inv,
    aten.sigmoid.default: jax.nn.sigmoid,
    aten.lgamma.default: lax.lgamma,
    aten.i0.default: jax.scipy.special.i0,
    aten.special_i0e.default: jax.scipy.special.i0e,
    aten.special_i1.default: jax.scipy.special.i1,
    aten.special_i1e.default: jax.scipy.special.i1e,
    aten.special_ndtr.default: jax.scipy.special.ndtr,
    aten.special_ndtri.default: jax.scipy.special.ndtri,
    aten.special_log_ndtr.default: jax.scipy.special.log_ndtr,
    aten.special_erfcx.default: jax.scipy.special.erfcx,
}


def _float_unary(fn):
    return lambda x: fn(to_float(x))


for _op, _fn in _FLOAT_MATH.items():
    register(_op)(_float_unary(_fn))


@register(aten.abs.default)
def abs_(x):
    return x if is_bool(x) else jnp.abs(x)


@register(aten.neg.default)
def neg(x):
    return jnp.negative(x)


@register(aten.reciprocal.default)
def reciprocal(x):
    return 1.0 / to_float(x)


@register(aten.square.default)
def square(x):
    return jnp.square(x.astype(jnp.int32) if is_bool(x) else x)


def _half_in_float32(fn):
    """fn computed in float32 for float16/bfloat16 inputs, rounded back: torch's CPU kernels of
    the gamma family take half values as float (the JAX series in half precision is far off)."""
    def wrapped(*args):
        *rest, x = args
        x = to_float(x)
        if x.dtype in (jnp.float16, jnp.bfloat16):
            return fn(*rest, x.astype(jnp.float32)).astype(x.dtype)
        return fn(*rest, x)
    return wrapped


@register(aten.digamma.default)
@_half_in_float32
def digamma(x):
    # torch defines digamma(±0) as ∓inf (a pole); lax returns NaN there.
    pole = jnp.where(jnp.signbit(x), jnp.inf, -jnp.inf).astype(x.dtype)
    return jnp.where(x == 0, pole, lax.digamma(x))


def _cot_derivative(n: int) -> np.ndarray:
    """Coefficients (ascending) of d^n/dx^n cot(pi x) as a polynomial in c = cot(pi x)."""
    p = np.array([0.0, 1.0])
    for _ in range(n):  # d/dx P(c) = P'(c) * (-pi (1 + c^2))
        p = P.polymul(P.polyder(p), [-np.pi, 0.0, -np.pi])
    return p


@register(aten.polygamma.default)
@_half_in_float32
def polygamma(n, x):
    if n == 0:
        return digamma(x)
    # jax's Hurwitz-zeta route is wrong for negative x; reflect those to 1 - x > 0 with
    # psi_n(x) = (-1)^n psi_n(1 - x) - pi * d^n/dx^n cot(pi x)
    neg = x < 0
    pos = jax.scipy.special.polygamma(n, jnp.where(neg, 1.0 - x, x))
    c = 1.0 / jnp.tan(jnp.pi * x)
    cot_n = sum(coef * c**k for k, coef in enumerate(_cot_derivative(n)) if coef)
    out = jnp.where(neg, (-1) ** n * pos - jnp.pi * cot_n, pos)
    if n == 1:  # torch's trigamma reflects too, so its values at the poles are the formula's
        return out
    # torch computes n >= 2 as (-1)^(n+1) n! zeta(n+1, x), and its zeta is +inf at the poles
    # x = 0, -1, -2, ...
    pole = (x <= 0) & (x == jnp.floor(x))
    return jnp.where(pole, jnp.asarray(jnp.inf if n % 2 else -jnp.inf, x.dtype), out)


@register(aten.sign.default, aten.sgn.default)
def sign(x):
    if is_bool(x):
        return x
    # torch: sign(NaN) == 0 (it computes (0 < x) - (x < 0)); jnp.sign returns NaN
    out = jnp.sign(x)
    return jnp.where(jnp.isnan(x), jnp.zeros_like(out), out) if is_float(x) else out


@register(aten.signbit.default)
def signbit(x):
    return jnp.signbit(x) if is_float(x) else x < 0


# ---------------------------------------------------------------------------- rounding
def _keep_int(fn):
    # integer and bool tensors round to themselves in torch
    return lambda x: x if not is_float(x) else fn(x)


register(aten.floor.default)(_keep_int(jnp.floor))
register(aten.ceil.default)(_keep_int(jnp.ceil))
register(aten.trunc.default)(_keep_int(jnp.trunc))
# jnp.round rounds half to even, as torch does
register(aten.round.default)(_keep_int(jnp.round))


@register(aten.frac.default)
def frac(x):
    return x - jnp.trunc(x)


@register(aten.round.decimals)
def round_decimals(x, *, decimals=0):
    if not is_float(x):
        return x
    # torch scales by 10**|decimals| the same way: multiply for d > 0, divide for d < 0
    scale = jnp.asarray(10.0 ** abs(decimals), x.dtype)
    if decimals >= 0:
        return jnp.round(x * scale) / scale
    return jnp.round(x / scale) * scale


# ---------------------------------------------------------------------------- predicates
@register(aten.isnan.default)
def isnan(x):
    return jnp.isnan(x) if is_float(x) else jnp.zeros(x.shape, jnp.bool_)


@register(aten.isinf.default)
def isinf(x):
    return jnp.isinf(x) if is_float(x) else jnp.zeros(x.shape, jnp.bool_)


@register(aten.isfinite.default)
def isfinite(x):
    return jnp.isfinite(x) if is_float(x) else jnp.ones(x.shape, jnp.bool_)


@register(aten.isposinf.default)
def isposinf(x):
    return jnp.isposinf(x) if is_float(x) else jnp.zeros(x.shape, jnp.bool_)


@register(aten.isneginf.default)
def isneginf(x):
    return jnp.isneginf(x) if is_float(x) else jnp.zeros(x.shape, jnp.bool_)


@register(aten.nan_to_num.default)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    if not is_float(x):
        return x
    info = jnp.finfo(x.dtype)
    nan = 0.0 if nan is None else nan
    posinf = float(info.max) if posinf is None else posinf
    neginf = float(info.min) if neginf is None else neginf
    x = jnp.where(jnp.isnan(x), jnp.asarray(nan, x.dtype), x)
    x = jnp.where(jnp.isposinf(x), jnp.asarray(posinf, x.dtype), x)
    return jnp.where(jnp.isneginf(x), jnp.asarray(neginf, x.dtype), x)


@register(aten.logit.default)
def logit(x, eps=None):
    x = to_float(x)
    if eps is not None:
        x = jnp.clip(x, eps, 1.0 - eps)
    return jnp.log(x / (1.0 - x))


@register(aten.logical_not.default)
def logical_not(x):
    return jnp.logical_not(x)


@register(aten.bitwise_not.default)
def bitwise_not(x):
    return jnp.invert(x)
