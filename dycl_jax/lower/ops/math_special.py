"""Special functions and float decomposition: igamma, igammac (regularised incomplete gamma), frexp."""
from __future__ import annotations

import jax.numpy as jnp
from jax.scipy import special

from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register


def _float(a, x):
    dt = jnp.promote_types(jnp.promote_types(a.dtype, x.dtype), jnp.float32)
    return a.astype(dt), x.astype(dt)


@register(aten.igamma.default)
def igamma(a, x):
    return special.gammainc(*_float(a, x))


@register(aten.igammac.default)
def igammac(a, x):
    return special.gammaincc(*_float(a, x))


@register(aten.frexp.Tensor)
def frexp(x):
    mantissa, exponent = jnp.frexp(x)
    return mantissa, exponent.astype(jnp.int32)
