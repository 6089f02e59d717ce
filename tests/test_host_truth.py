"""The dispatch host's reading of a decision (`DispatchHost.truth`, numpy's read of a one-element
JAX array) gives what `bool()` gives, for every dtype a predicate may have, and JAX's own error
for an array of several elements."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from dycl_jax.host.dispatch import DispatchHost


@pytest.mark.parametrize("value", [
    jnp.array(True), jnp.array(False), jnp.array([True]), jnp.array([[False]]), jnp.array(0.0), jnp.array(-0.0),
    jnp.array(1e-30), jnp.array(np.nan), jnp.array(0, jnp.int32), jnp.array(-3, jnp.int32), jnp.array(1, jnp.uint8),
    jnp.array(0.5, jnp.bfloat16), jnp.array(0, jnp.float16), np.array(True), True, 0, 2.5])
def test_truth_is_bool(value):
    assert DispatchHost.truth(value) is bool(value)


def test_several_elements_raise_as_bool_does():
    with pytest.raises(Exception) as ours:
        DispatchHost.truth(jnp.array([True, False]))
    with pytest.raises(Exception) as theirs:
        bool(jnp.array([True, False]))
    assert type(ours.value) is type(theirs.value)
