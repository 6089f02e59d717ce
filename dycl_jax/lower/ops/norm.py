"""Normalisation: batch norm (running or batch statistics), layer norm, group norm."""
from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from dycl_jax.errors import DyclError
from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register


def _compute_dtype(x) -> jnp.dtype:
    # half-precision inputs are normalised in float32, as torch's CPU kernels accumulate
    return jnp.promote_types(x.dtype, jnp.float32)


def _channel_shape(x) -> tuple[int, ...]:
    return (1, -1) + (1,) * (x.ndim - 2)


def _affine(y, weight, bias, shape):
    if weight is not None:
        y = y * weight.astype(y.dtype).reshape(shape)
    if bias is not None:
        y = y + bias.astype(y.dtype).reshape(shape)
    return y


def _batch_stats(xf):
    axes = (0,) + tuple(range(2, xf.ndim))
    mean = xf.mean(axis=axes)
    var = jnp.square(xf - mean.reshape(_channel_shape(xf))).mean(axis=axes)  # biased, as torch
    return mean, var


def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new_running_mean, new_running_var)."""
    dt = _compute_dtype(x)
    xf = x.astype(dt)
    shape = _channel_shape(x)
    if training or running_mean is None:
        mean, var = _batch_stats(xf)
        rstd = lax.rsqrt(var + eps)
        y = (xf - mean.reshape(shape)) * rstd.reshape(shape)
        save_mean, save_rstd = mean, rstd
        new_mean = new_var = None
        if running_mean is not None:
            # functional form of torch's in-place running-stat update (unbiased variance)
            count = x.size // x.shape[1]
            unbiased = var * (count / max(count - 1, 1))
            new_mean = (1 - momentum) * running_mean.astype(dt) + momentum * mean
            new_var = (1 - momentum) * running_var.astype(dt) + momentum * unbiased
    else:
        rstd = lax.rsqrt(running_var.astype(dt) + eps)
        y = (xf - running_mean.astype(dt).reshape(shape)) * rstd.reshape(shape)
        # torch returns empty save_mean/save_invstd in inference
        save_mean = save_rstd = jnp.zeros((0,), dt)
        new_mean, new_var = running_mean, running_var
    return _affine(y, weight, bias, shape), save_mean, save_rstd, new_mean, new_var


@register(aten._native_batch_norm_legit_no_training.default)
def batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@register(aten.native_batch_norm.default, aten._native_batch_norm_legit.default)
def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if training and running_mean is not None:
        # these overloads update the running statistics in place, which a pure converted
        # model cannot do (functionalised graphs use _native_batch_norm_legit_functional)
        raise DyclError(
            "batch norm in training mode updates its running statistics in place",
            fix="convert the model in eval mode (model.eval()), or use track_running_stats=False",
        )
    return _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)[:3]


@register(aten._native_batch_norm_legit.no_stats)
def batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    # instance norm without running statistics lowers to this: always batch statistics
    return _batch_norm(x, weight, bias, None, None, True, momentum, eps)[:3]


@register(aten._native_batch_norm_legit_functional.default)
def batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps)


@register(aten.native_layer_norm.default)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    dt = _compute_dtype(x)
    xf = x.astype(dt)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = xf.mean(axis=axes, keepdims=True)
    var = jnp.square(xf - mean).mean(axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    y = (xf - mean) * rstd
    if weight is not None:
        y = y * weight.astype(dt)
    if bias is not None:
        y = y + bias.astype(dt)
    return y, mean, rstd


@register(aten.native_group_norm.default)
def native_group_norm(x, weight, bias, N, C, HxW, group, eps):
    # N/C/HxW repeat x's shape; x itself is used so a dynamic batch needs no SymInt plumbing
    dt = _compute_dtype(x)
    n, c = x.shape[0], x.shape[1]
    per_group = math.prod(x.shape[1:]) // group  # not -1: an empty batch (n = 0) leaves it undetermined
    xg = x.astype(dt).reshape(n, group, per_group)
    mean = xg.mean(axis=-1, keepdims=True)
    var = jnp.square(xg - mean).mean(axis=-1, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    y = ((xg - mean) * rstd).reshape(x.shape)
    return _affine(y, weight, bias, _channel_shape(x)), mean.reshape(n, group), rstd.reshape(n, group)
