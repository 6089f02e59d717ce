"""Outputs of a method whose decode loop was unrolled: padded arrays trimmed to their lengths,
and the located error for an input that needs more than `max_len` iterations."""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from dycl_jax.rewrite.padding import Decoded, Padded
from dycl_jax.errors import decode_bound_error
from dycl_jax.runtime.loaded import trim

# the padded forms are JAX pytrees too: `jm.apply` / `jm.padded` return them under jit and vmap
jax.tree_util.register_pytree_node(Padded, lambda p: ((p.value, p.lengths), None), lambda _, c: Padded(*c))
jax.tree_util.register_pytree_node(Decoded, lambda d: ((d.value, d.exceeded), d.where),
                                   lambda where, c: Decoded(c[0], c[1], where))


def trimmed(p: Padded) -> Any:
    """The exact array: `p.value` cut to `p.lengths`."""
    return trim(p.value, p.lengths)


def finish(out: Any) -> Any:
    """The method's exact result from its padded form; raises if the loop ran out of max_len."""
    if not isinstance(out, Decoded):
        return out
    if bool(np.any(np.asarray(out.exceeded))):
        raise decode_bound_error(out.where)
    return jax.tree_util.tree_map(lambda x: trimmed(x) if isinstance(x, Padded) else x, out.value,
                                  is_leaf=lambda x: isinstance(x, Padded))
