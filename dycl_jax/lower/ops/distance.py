"""Distances: pdist (the condensed pairwise p-norm distance of the rows of a matrix)."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register


def _safe_norm(d, p: float):
    """The p-norm of the rows of d with a zero gradient where the norm is 0 (torch's backward)."""
    if p == 0:
        return (d != 0).sum(-1).astype(d.dtype)
    if math.isinf(p):
        return jnp.abs(d).max(-1)
    if p == 1:
        return jnp.abs(d).sum(-1)
    # |d|^p summed, then the root; where every difference is 0 both steps get a safe operand,
    # since the root's derivative at 0 is infinite and would give NaN gradients
    power = (jnp.abs(d) ** p).sum(-1) if p != 2 else jnp.square(d).sum(-1)
    zero = power == 0
    root = jnp.where(zero, 1, power) ** (1 / p)
    return jnp.where(zero, 0, root)


@register(aten._pdist_forward.default)
def pdist_forward(x, p=2.0):
    n = x.shape[0]
    i, j = np.triu_indices(n, k=1)  # pairs (0,1), (0,2), ..., (n-2, n-1): torch's order
    return _safe_norm(x[i] - x[j], float(p))


@register(aten._cdist_forward.default)
def cdist_forward(x1, x2, p, compute_mode=None):
    # compute_mode picks torch's matmul formula for p = 2; the direct differences are exact
    return _safe_norm(x1[..., :, None, :] - x2[..., None, :, :], float(p))


@register(aten.dist.default)
def dist(a, b, p=2):
    d = (a - b).reshape(-1)
    if d.dtype in (jnp.float16, jnp.bfloat16):  # torch's norm accumulates half inputs in float32
        return _safe_norm(d.astype(jnp.float32), float(p)).astype(d.dtype)
    return _safe_norm(d, float(p))
