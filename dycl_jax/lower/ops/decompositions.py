"""Matrix decompositions and solves: det, slogdet, svd, triangular solves."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register



def _lu(a):
    """(LU, 1-based int32 pivots) as torch's getrf returns them (later outputs of det/slogdet)."""
    lu, pivots, _ = lax.linalg.lu(a)
    return lu, (pivots + 1).astype(jnp.int32)


@register(aten._linalg_det.default)
def linalg_det(a):
    return (jnp.linalg.det(a), *_lu(a))


@register(aten._linalg_slogdet.default)
def linalg_slogdet(a):
    sign, logabs = jnp.linalg.slogdet(a)
    return (sign, logabs, *_lu(a))


@register(aten._linalg_svd.default)
def linalg_svd(a, full_matrices=False, compute_uv=True, driver=None):
    # driver selects a CUDA solver; on the CPU torch and XLA both use LAPACK's gesdd
    if not compute_uv:
        s = jnp.linalg.svd(a, compute_uv=False)
        return jnp.zeros((0,), a.dtype), s, jnp.zeros((0,), a.dtype)
    u, s, vh = jnp.linalg.svd(a, full_matrices=full_matrices)
    return u, s, vh


def _broadcast_batch(a, b):
    """a and b with their batch dims (all but the last two) broadcast to one shape."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[-2:])


@register(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    a, b = _broadcast_batch(a, b)
    dt = jnp.promote_types(a.dtype, b.dtype)
    return lax.linalg.triangular_solve(a.astype(dt), b.astype(dt), left_side=left, lower=not upper,
                                       unit_diagonal=unitriangular)


@register(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    """(X, A) with op(A) X = b, op transposing A when asked; A comes back as the clone torch returns."""
    a, b = _broadcast_batch(a, b)
    dt = jnp.promote_types(a.dtype, b.dtype)
    x = lax.linalg.triangular_solve(a.astype(dt), b.astype(dt), left_side=True, lower=not upper,
                                    transpose_a=transpose, unit_diagonal=unitriangular)
    return x, a
