"""Complex views: view_as_complex / view_as_real between float (..., 2) tensors and complex ones."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register


@register(aten.view_as_complex.default)
def view_as_complex(x):
    # torch views the pairs' memory; as values that is real + i·imag
    return lax.complex(x[..., 0], x[..., 1])


@register(aten.view_as_real.default)
def view_as_real(z):
    return jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1)
