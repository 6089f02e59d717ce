"""Outputs of a method whose decode loop was unrolled: padded arrays trimmed to their lengths,
and the located error for an input that needs more than `max_len` iterations."""
from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from dycl_jax.errors import DecodeBoundError, Location
from dycl_jax.rewrite.padding import Decoded, Padded

# the padded forms are JAX pytrees too: `jm.apply` / `jm.padded` return them under jit and vmap
jax.tree_util.register_pytree_node(Padded, lambda p: ((p.value, p.lengths), None), lambda _, c: Padded(*c))
jax.tree_util.register_pytree_node(Decoded, lambda d: ((d.value, d.exceeded), d.where),
                                   lambda where, c: Decoded(c[0], c[1], where))


def trimmed(p: Padded) -> Any:
    """The exact array: `p.value` cut to `p.lengths`."""
    return p.value[tuple(slice(0, int(n)) for n in np.asarray(p.lengths))]


def finish(out: Any) -> Any:
    """The method's exact result from its padded form; raises if the loop ran out of max_len."""
    if not isinstance(out, Decoded):
        return out
    if bool(np.any(np.asarray(out.exceeded))):
        file, line, code, max_len = out.where
        raise DecodeBoundError(
            f"the loop at {os.path.basename(file)}:{line} was unrolled for at most max_len={max_len} iterations, "
            "and this input needs more: the staged program did not reach the loop's exit",
            location=Location(file, line, code),
            fix=f"convert with a larger max_len (e.g. max_len={2 * max_len}), or with host=\"auto\" / \"dispatch\" "
            "to run the loop exactly for every input")
    return jax.tree_util.tree_map(lambda x: trimmed(x) if isinstance(x, Padded) else x, out.value,
                                  is_leaf=lambda x: isinstance(x, Padded))
