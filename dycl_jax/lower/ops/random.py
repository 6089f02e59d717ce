"""Random ops (dropout, bernoulli, rand/randn, normal, uniform, randint, multinomial), each
drawing from the program's key (lower/keys.py). torch's generator is not reproduced: the
values follow the same distributions, not the same stream."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from dycl_jax.lower.dtypes import int64
from dycl_jax.lower.keys import next_key
from dycl_jax.lower.ops._util import aten, jdtype
from dycl_jax.lower.ops.creation import _shape
from dycl_jax.lower.registry import register


def _float(dtype: Any, like: Any = None) -> Any:
    """torch's dtype for a random factory: the argument, else the template's, else float32."""
    return jdtype(dtype) or (like.dtype if like is not None else jnp.float32)


def _uniform(shape: tuple[int, ...], dtype: Any, op: str, low: Any = 0.0, high: Any = 1.0) -> Any:
    # drawn in float32 at least, then rounded once, as torch's half kernels do
    wide = jnp.promote_types(dtype, jnp.float32)
    return jax.random.uniform(next_key(op), shape, wide, low, high).astype(dtype)


def _normal(shape: tuple[int, ...], dtype: Any, op: str) -> Any:
    wide = jnp.promote_types(dtype, jnp.float32)
    return jax.random.normal(next_key(op), shape, wide).astype(dtype)


@register(aten.native_dropout.default)
def native_dropout(x, p: float, train: bool | None):
    if not train or p == 0:
        return x, jnp.ones(x.shape, dtype=bool)
    if p >= 1:  # torch zeroes everything (its scale would be infinite)
        return jnp.zeros_like(x), jnp.zeros(x.shape, dtype=bool)
    keep = jax.random.bernoulli(next_key("dropout"), 1.0 - p, x.shape)
    return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - p), x.dtype), jnp.zeros((), x.dtype)), keep


@register(aten.rand.default)
def rand(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _uniform(_shape(size, "rand"), _float(dtype), "rand")


@register(aten.rand_like.default)
def rand_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _uniform(x.shape, _float(dtype, x), "rand_like")


@register(aten.randn.default)
def randn(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _normal(_shape(size, "randn"), _float(dtype), "randn")


@register(aten.randn_like.default)
def randn_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return _normal(x.shape, _float(dtype, x), "randn_like")


@register(aten.uniform.default)
def uniform(x, low=0.0, high=1.0, *, generator=None):
    return _uniform(x.shape, x.dtype, "uniform", low, high)


@register(aten.normal_functional.default)
def normal_functional(x, mean=0.0, std=1.0, *, generator=None):
    return _normal(x.shape, x.dtype, "normal") * std + mean


@register(aten.normal.Tensor_Tensor, aten.normal.Tensor_float, aten.normal.float_Tensor)
def normal(mean, std=1.0, *, generator=None):
    like = mean if hasattr(mean, "shape") else std
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    return _normal(shape, like.dtype, "normal") * std + mean


@register(aten.normal.float_float)
def normal_float(mean, std, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return _normal(_shape(size, "normal"), _float(dtype), "normal") * std + mean


@register(aten.bernoulli.default)
def bernoulli(probs, *, generator=None):
    return (_uniform(probs.shape, jnp.float32, "bernoulli") < probs).astype(probs.dtype)


@register(aten.bernoulli.p)
def bernoulli_p(x, p=0.5, *, generator=None):
    return jax.random.bernoulli(next_key("bernoulli"), p, x.shape).astype(x.dtype)


@register(aten.bernoulli.Tensor)
def bernoulli_tensor(x, p, *, generator=None):
    return (_uniform(x.shape, jnp.float32, "bernoulli") < jnp.broadcast_to(p, x.shape)).astype(x.dtype)


@register(aten.randint.default)
def randint(high, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return randint_low(0, high, size, dtype=dtype)


@register(aten.randint.low)
def randint_low(low, high, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    dt = jdtype(dtype) or int64()
    return jax.random.randint(next_key("randint"), _shape(size, "randint"), low, high, dt)


@register(aten.multinomial.default)
def multinomial(probs, num_samples: int, replacement: bool = False, *, generator=None):
    key = next_key("multinomial")
    logits = jnp.log(probs.astype(jnp.float32))
    if replacement:
        shape = (*probs.shape[:-1], num_samples)
        draws = jax.random.categorical(key, logits[..., None, :], axis=-1, shape=shape)
    else:
        # Gumbel top-k: the order of the k largest perturbed logits is a draw without replacement
        perturbed = logits + jax.random.gumbel(key, logits.shape)
        draws = jax.lax.top_k(perturbed, num_samples)[1]
    return draws.astype(int64())
