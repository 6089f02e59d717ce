"""Index tables fixed by their arguments: tril_indices, triu_indices."""
from __future__ import annotations

import numpy as np
import torch

from dycl_jax.lower.dtypes import to_jax_dtype
from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register


def _table(rows, cols, dtype) -> np.ndarray:
    return np.stack([rows, cols]).astype(to_jax_dtype(dtype if dtype is not None else torch.int64))


@register(aten.tril_indices.default)
def tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _table(*np.tril_indices(row, offset, col), dtype)


@register(aten.triu_indices.default)
def triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _table(*np.triu_indices(row, offset, col), dtype)
