"""The shared end-to-end comparison (differential.assert_same) rejects wrong dtypes, values and shapes."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from differential import assert_same  # pytest puts tests/ on sys.path


def test_same_dtype_follows_the_policy() -> None:
    x = torch.arange(4.0)
    assert_same(x, np.arange(4, dtype=np.float32), "float32")
    for wrong in (np.float64, np.float16, np.int32):
        with pytest.raises(AssertionError, match="dtype"):
            assert_same(x, np.arange(4).astype(wrong), "float32 as another dtype")
    ids = torch.arange(4)  # int64: held as int32, or int64 in a 64-bit program
    assert_same(ids, np.arange(4, dtype=np.int32), "int64 as int32")
    assert_same(ids, np.arange(4, dtype=np.int64), "int64 kept")
    with pytest.raises(AssertionError, match="dtype"):
        assert_same(ids, np.arange(4, dtype=np.float32), "int64 as float")
    with pytest.raises(AssertionError, match="dtype"):
        assert_same(torch.tensor([True, False]), np.array([1, 0], np.int32), "bool as int")
    assert_same(x.bfloat16(), jnp.arange(4, dtype=jnp.bfloat16), "bfloat16")
    with pytest.raises(AssertionError, match="dtype"):
        assert_same(x.bfloat16(), jnp.arange(4, dtype=jnp.float16), "bfloat16 as float16")
    assert_same((3, 2.5, True), (np.int32(3), np.float32(2.5), np.bool_(True)), "Python numbers")
    with pytest.raises(AssertionError, match="dtype"):
        assert_same((3,), (np.float32(3),), "a Python int as a float")


def test_values_and_shapes() -> None:
    x = torch.tensor([1.0, 2.0])
    with pytest.raises(AssertionError):
        assert_same(x, np.array([1.0, 2.01], np.float32), "value")
    with pytest.raises(AssertionError, match="shape"):
        assert_same(x, np.array([[1.0, 2.0]], np.float32), "shape")
    with pytest.raises(AssertionError):
        assert_same(torch.tensor([2**33]), np.array([2**33], np.int64).astype(np.int32), "wrapped int64")
