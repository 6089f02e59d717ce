"""Reductions (sum, mean, prod, amax, var, any, argmax, norms) and cumulative scans."""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from dycl_jax.lower.dtypes import int64
from dycl_jax.lower.ops._util import aten, jdtype, norm_dim, norm_dims
from dycl_jax.lower.ops.elementwise import is_float, to_float
from dycl_jax.lower.registry import register


def _axes(dim: Any, x: Any) -> tuple[int, ...] | None:
    """Reduction axes; None (all) for None, [] (ATen: all dims) and for 0-d tensors."""
    return None if x.ndim == 0 else norm_dims(dim, x.ndim)


def _in(x: Any, dtype: Any) -> Any:
    # an explicit dtype converts the input before reducing, as torch accumulates in it
    return x if dtype is None else x.astype(jdtype(dtype))


@register(aten.sum.dim_IntList)
def sum_dim(x, dim=None, keepdim=False, *, dtype=None):
    return jnp.sum(_in(x, dtype), axis=_axes(dim, x), keepdims=keepdim)


@register(aten.sum.default)
def sum_all(x, *, dtype=None):
    return jnp.sum(_in(x, dtype))


@register(aten.mean.dim)
def mean_dim(x, dim=None, keepdim=False, *, dtype=None):
    return jnp.mean(_in(x, dtype), axis=_axes(dim, x), keepdims=keepdim)


@register(aten.mean.default)
def mean_all(x, *, dtype=None):
    return jnp.mean(_in(x, dtype))


@register(aten.prod.dim_int)
def prod_dim(x, dim, keepdim=False, *, dtype=None):
    return jnp.prod(_in(x, dtype), axis=_axes(dim, x), keepdims=keepdim)


@register(aten.prod.default)
def prod_all(x, *, dtype=None):
    return jnp.prod(_in(x, dtype))


# jnp.max/min propagate NaN, as torch's amax/amin/max/min do
@register(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_axes(dim, x), keepdims=keepdim)


@register(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_axes(dim, x), keepdims=keepdim)


@register(aten.max.default)
def max_all(x):
    return jnp.max(x)


@register(aten.min.default)
def min_all(x):
    return jnp.min(x)


def _arg_extreme(find, x, dim, keepdim):
    # lax.argmax/argmin return the first index on ties and treat NaN as the extreme, like torch.
    # The index is computed as int32 (sizes are below 2**31) and widened by the caller's cast:
    # jnp.argmax asks for int64 inside a 64-bit scope, which XLA lowering outside that scope (a
    # user's `jax.jit(jm.apply)`) turns into a type mismatch.
    if dim is None or x.ndim == 0:
        idx = find(x.reshape(-1), 0, jnp.int32)
        return idx.reshape((1,) * x.ndim) if keepdim else idx
    axis = norm_dim(dim, x.ndim)
    idx = find(x, axis, jnp.int32)
    return jnp.expand_dims(idx, axis) if keepdim else idx


@register(aten.argmax.default)
def argmax(x, dim=None, keepdim=False):
    return _arg_extreme(jax.lax.argmax, x, dim, keepdim)


@register(aten.argmin.default)
def argmin(x, dim=None, keepdim=False):
    return _arg_extreme(jax.lax.argmin, x, dim, keepdim)


def _any(x, dim=None, keepdim=False):
    return jnp.any(x, axis=_axes(dim, x), keepdims=keepdim)


def _all(x, dim=None, keepdim=False):
    return jnp.all(x, axis=_axes(dim, x), keepdims=keepdim)


register(aten.any.default, aten.any.dim, aten.any.dims)(_any)
register(aten.all.default, aten.all.dim, aten.all.dims)(_all)


@register(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def count_nonzero(x, dim=None):
    return jnp.sum(x != 0, axis=_axes(dim, x))


# ---------------------------------------------------------------------------- moments
def _var(x, dim, correction, keepdim):
    x = to_float(x)
    axes = _axes(dim, x)
    correction = 1 if correction is None else correction
    n = x.size if axes is None else math.prod(x.shape[a] for a in axes)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    sq = jnp.real(centered * jnp.conj(centered))
    # torch divides by max(N - correction, 0): N <= correction gives inf or NaN, never < 0
    var = jnp.sum(sq, axis=axes, keepdims=keepdim) / max(n - correction, 0)
    return var, (mean if keepdim else jnp.squeeze(mean, axis=axes))


@register(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    return _var(x, dim, correction, keepdim)[0]


@register(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_var(x, dim, correction, keepdim)[0])


@register(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    return _var(x, dim, correction, keepdim)


@register(aten.std_mean.correction)
def std_mean(x, dim=None, *, correction=None, keepdim=False):
    v, m = _var(x, dim, correction, keepdim)
    return jnp.sqrt(v), m


@register(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    return jax.nn.logsumexp(to_float(x), axis=_axes(dim, x), keepdims=keepdim)


@register(aten.linalg_vector_norm.default)
def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    x = jnp.abs(to_float(_in(x, dtype)))
    if x.dtype in (jnp.float16, jnp.bfloat16):  # torch accumulates half norms in float32: x*x overflows at 256
        x = x.astype(jnp.float32)
    axes = _axes(dim, x)
    if ord == float("inf"):
        return jnp.max(x, axis=axes, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(x, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((x != 0).astype(x.dtype), axis=axes, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(x, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(x * x, axis=axes, keepdims=keepdim))
    return jnp.sum(x**ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


# ---------------------------------------------------------------------------- scans
def _scan_in(x, dtype):
    # torch scans bool and integer tensors in int64; jnp would keep int8/uint8/int16 and wrap
    if dtype is None and not is_float(x):
        return x.astype(int64())
    return _in(x, dtype)


@register(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    x = _scan_in(x, dtype)
    if x.ndim == 0:
        return x
    return jnp.cumsum(x, axis=norm_dim(dim, x.ndim))


@register(aten.cumprod.default)
def cumprod(x, dim, *, dtype=None):
    x = _scan_in(x, dtype)
    if x.ndim == 0:
        return x
    return jnp.cumprod(x, axis=norm_dim(dim, x.ndim))


@register(aten.logcumsumexp.default)
def logcumsumexp(x, dim):
    x = to_float(x)
    if x.ndim == 0:
        return x
    return lax.cumlogsumexp(x, axis=norm_dim(dim, x.ndim))


def _cum_extreme(x, dim, later_wins):
    """cummax/cummin with torch's choice of index: the latest tie, and NaN beats everything."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int32)
    axis = norm_dim(dim, x.ndim)
    idx = lax.broadcasted_iota(jnp.int32, x.shape, axis)
    nan = jnp.isnan if is_float(x) else (lambda v: jnp.zeros(v.shape, jnp.bool_))

    def combine(a, b):
        (va, ia), (vb, ib) = a, b
        take_b = nan(vb) | (~nan(va) & later_wins(vb, va))
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    return lax.associative_scan(combine, (x, idx), axis=axis)


@register(aten.cummax.default)
def cummax(x, dim):
    return _cum_extreme(x, dim, lambda new, old: new >= old)


@register(aten.cummin.default)
def cummin(x, dim):
    return _cum_extreme(x, dim, lambda new, old: new <= old)
