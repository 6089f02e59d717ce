"""Complex numbers: view_as_complex / view_as_real, complex, polar, angle."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register

# Complex values are JAX complex64 arrays inside a program (torch.complex128 is held as
# complex64, as float64 is held as float32 outside a 64-bit scope); a complex output leaves
# the program as a complex64 array.


@register(aten.view_as_complex.default)
def view_as_complex(x):
    # torch views the pairs' memory; as values that is real + i·imag
    return lax.complex(x[..., 0], x[..., 1])


@register(aten.view_as_real.default)
def view_as_real(z):
    return jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1)


@register(aten.complex.default)
def complex_(real, imag):
    real, imag = jnp.broadcast_arrays(real, imag)
    return lax.complex(real, imag)


@register(aten.polar.default)
def polar(abs_, angle):
    abs_, angle = jnp.broadcast_arrays(abs_, angle)
    return lax.complex(abs_ * jnp.cos(angle), abs_ * jnp.sin(angle))


@register(aten.angle.default)
def angle(x):
    if jnp.iscomplexobj(x):
        return jnp.angle(x)
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    # torch: pi for negative reals, 0 otherwise, NaN kept
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.pi, 0).astype(x.dtype))
