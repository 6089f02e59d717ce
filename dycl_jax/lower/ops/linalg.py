"""Matrix products: mm, addmm, bmm and friends."""
from __future__ import annotations

import jax.numpy as jnp

from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register


@register(aten.mm.default)
def mm(a, b):
    return jnp.matmul(a, b)


@register(aten.bmm.default)
def bmm(a, b):
    return jnp.matmul(a, b)


@register(aten.addmm.default)
def addmm(bias, a, b, *, beta=1, alpha=1):
    out = jnp.matmul(a, b)
    if alpha != 1:
        out = out * alpha
    if beta == 0:
        return out
    return out + (bias if beta == 1 else bias * beta)
