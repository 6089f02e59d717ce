"""The dispatch host's signature key of a part's inputs: the shortcut for flat inputs (arrays,
modules, Python scalars) must give the key, leaves and tree that flattening gives."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dycl_jax.host import values
from dycl_jax.rewrite.plan import Undefined


def _general(vals: tuple, attrs: tuple | None) -> tuple[list, tuple]:
    """Leaves and key as the host builds them by flattening (values.call_key without its shortcut)."""
    leaves, tree = jax.tree_util.tree_flatten(jax.tree_util.tree_map(values.open_closures, (vals, attrs)))
    leaves = [values.to_jax(v) if isinstance(v, torch.Tensor) else v for v in leaves]
    return leaves, (tree, tuple(map(values.leaf_key, leaves)), torch.is_grad_enabled(), values.same_arrays(leaves))


x, y = jnp.ones((2, 3)), jnp.zeros((2, 3), jnp.int32)
lin = torch.nn.Linear(2, 2)
scale = 2.0


def _closure(v):
    return v * scale + x  # closes over a JAX array: opened into its value


CASES = {
    "arrays and a module": (lin, x, y),
    "one array under two names": (x, x, y),  # aliased leaves enter the key
    "numpy input and ints": (np.ones(3, np.float32), 3, True, 1.5),
    "None among inputs": (x, None, 3),  # None is an empty pytree, not a leaf
    "a list": ([x, y], 2),
    "a tensor": (torch.ones(2), x),  # a torch tensor becomes a JAX array
    "a closure": (_closure, x),
    "undefined name": (Undefined("h"), x),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("attrs", [None, (x, 4)])
def test_key_matches_flattening(name: str, attrs: tuple | None) -> None:
    vals = CASES[name]
    for _ in range(2):  # the second call takes the remembered verdict for these input types
        leaves, tree, key = values.call_key(vals, attrs)
        want_leaves, want = _general(vals, attrs)
        assert key == want and tree == want[0]
        assert [type(v) for v in leaves] == [type(v) for v in want_leaves]


def test_key_tells_aliasing_and_shapes_apart() -> None:
    keys = {values.call_key(v, None)[2] for v in [(x, x), (x, jnp.ones((2, 3))), (x, jnp.ones((3, 2))), (lin, x)]}
    assert len(keys) == 4
    with torch.no_grad():
        assert values.call_key((x, y), None)[2] != _general_with_grad((x, y))


def _general_with_grad(vals: tuple) -> tuple:
    with torch.enable_grad():
        return _general(vals, None)[1]


class _Grid(np.ndarray):
    """A numpy subclass: keyed by shape and dtype like a plain array."""


def test_leaf_key_decided_once_per_type_keys_each_value_as_before() -> None:
    """leaf_key remembers per exact type how it keys it; a second value of a seen type must still
    be keyed by its own shape, value or identity (never the first value's)."""
    other = torch.nn.Linear(2, 2)
    grid = np.ones((2, 2), np.float32).view(_Grid)
    for first, second, want in [
        (lin, other, ("id", id(other))),  # modules: by identity
        (grid, np.zeros((3,), np.int32).view(_Grid), ((3,), np.dtype(np.int32))),
        (x, jnp.ones((4,)), ((4,), jnp.ones((4,)).dtype)),
        (3, 4, (int, 4)),
        (True, False, (bool, False)),
        (np.float32(1.0), np.float32(2.5), (np.float32, 2.5)),
        ((1, 2), (1, 3), (tuple, ((int, 1), (int, 3)))),
        (1.5, float("nan"), (float, float("nan").hex())),
    ]:
        values.leaf_key(first)
        assert values.leaf_key(second) == want
