"""Activation functions that survive core-ATen decomposition, and softmax / log_softmax."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dycl_jax.errors import DyclError
from dycl_jax.lower.ops._util import aten, norm_dim
from dycl_jax.lower.ops.binary import clamp_between
from dycl_jax.lower.ops.elementwise import to_float
from dycl_jax.lower.registry import register


@register(aten.relu.default)
def relu(x):
    # NaN stays NaN, and the gradient at 0 is 0 (jnp.maximum would split it 0.5/0.5), as in torch
    return jax.nn.relu(x)


@register(aten.gelu.default)
def gelu(x, *, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"unknown gelu approximation {approximate!r}")
    # jax.nn.gelu defaults to the tanh form; torch's default is the exact erf form
    return jax.nn.gelu(to_float(x), approximate=approximate == "tanh")


@register(aten.hardtanh.default)
def hardtanh(x, min_val=-1.0, max_val=1.0):
    return clamp_between(x, min_val, max_val)


@register(aten.leaky_relu.default)
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


@register(aten.elu.default)
def elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    neg = jnp.expm1(x * input_scale) * (alpha * scale)
    return jnp.where(x > 0, x * scale, neg)


@register(aten.celu.default)
def celu(x, alpha=1.0):
    return jnp.where(x > 0, x, jnp.expm1(x / alpha) * alpha)


@register(aten.selu.default)
def selu(x):
    alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
    return elu(x, alpha, scale)


@register(aten.threshold.default)
def threshold(x, threshold, value):
    return jnp.where(x <= threshold, jnp.asarray(value, x.dtype), x)


def _softplus(x, beta=1.0, threshold=20.0):
    scaled = x * beta
    # above the threshold torch returns x unchanged (log1p(exp) would overflow)
    safe = jnp.where(scaled > threshold, jnp.zeros_like(scaled), scaled)
    return jnp.where(scaled > threshold, x, jnp.log1p(jnp.exp(safe)) / beta)


register(aten.softplus.default)(_softplus)


@register(aten.silu.default)
def silu(x):
    return x * jax.nn.sigmoid(x)


@register(aten.mish.default)
def mish(x):
    return x * jnp.tanh(_softplus(x))


@register(aten.hardsigmoid.default)
def hardsigmoid(x):
    return jnp.clip(x + 3.0, 0.0, 6.0) / 6.0


@register(aten.hardswish.default)
def hardswish(x):
    return x * (jnp.clip(x + 3.0, 0.0, 6.0) / 6.0)


@register(aten.glu.default)
def glu(x, dim=-1):
    a, b = jnp.split(x, 2, axis=norm_dim(dim, x.ndim))
    return a * jax.nn.sigmoid(b)


@register(aten._prelu_kernel.default)
def prelu_kernel(x, weight):
    return jnp.where(x > 0, x, weight * x)


@register(aten.log_sigmoid_forward.default)
def log_sigmoid_forward(x):
    # the second output is the buffer torch's CPU kernel keeps for backward: exp(-|x|)
    return jax.nn.log_sigmoid(x), jnp.exp(-jnp.abs(x))


def _wide(x):
    # low-precision inputs are accumulated in float32, as torch's kernels do; the interpreter
    # casts the result back to the dtype torch recorded (float32 when half_to_float is set)
    return x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else to_float(x)


@register(aten._softmax.default)
def softmax(x, dim, half_to_float=False):
    return jax.nn.softmax(_wide(x), axis=_softmax_axis(dim, x.ndim))


@register(aten._log_softmax.default)
def log_softmax(x, dim, half_to_float=False):
    return jax.nn.log_softmax(_wide(x), axis=_softmax_axis(dim, x.ndim))


def _softmax_axis(dim: int, ndim: int) -> int | None:
    # torch accepts dim 0 / -1 on a 0-d tensor (softmax of one value is 1); JAX has no axis 0 there
    return norm_dim(dim, ndim) if ndim else None



@register(aten.rrelu_with_noise_functional.default)
def rrelu_with_noise(x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None):
    if training:
        raise DyclError(
            "rrelu in training mode draws random slopes, which a converted model does not reproduce",
            fix="call F.rrelu with training=False (or use nn.RReLU in eval mode)",
        )
    # in eval mode torch uses the mean slope, i.e. a leaky ReLU; `noise` passes through
    return leaky_relu(x, (lower + upper) / 2), noise
