"""Small helpers shared by the op lowerings."""
from __future__ import annotations

from typing import Any, Sequence

import jax.numpy as jnp
import torch

from dycl_jax.lower.dtypes import to_jax_dtype

aten = torch.ops.aten


def norm_dim(dim: int, ndim: int) -> int:
    """A possibly negative torch dim as a non-negative axis (0-d tensors accept 0 and -1)."""
    if ndim == 0:
        return 0
    return dim + ndim if dim < 0 else dim


def norm_dims(dims: Sequence[int] | int | None, ndim: int) -> tuple[int, ...] | None:
    """torch dim lists → axes; None or an empty list means all dims (ATen's convention)."""
    if dims is None:
        return None
    if isinstance(dims, int):
        dims = [dims]
    if len(dims) == 0:
        return None
    return tuple(norm_dim(d, ndim) for d in dims)


def jdtype(dtype: torch.dtype | None) -> Any:
    """The JAX dtype for a torch dtype argument (None stays None)."""
    return to_jax_dtype(dtype)


def as_array(x: Any) -> jnp.ndarray:
    return x if hasattr(x, "dtype") else jnp.asarray(x)
