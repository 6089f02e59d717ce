"""host/values.placeholder: the stand-in value of an array leaf, when a part is captured again
(export, emit), is a torch tensor of the dtype and shape the host itself gives the user's code
for that array (`to_torch`), for every dtype dycl_jax accepts; one mapping serves both."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dycl_jax.errors import UnsupportedDtypeError
from dycl_jax.host import values
from dycl_jax.lower.dtypes import torch_dtype

# every accepted dtype, with the torch dtype of the values it holds on the host
ACCEPTED = [(np.bool_, torch.bool), (np.uint8, torch.uint8), (np.int8, torch.int8), (np.int16, torch.int16),
            (np.int32, torch.int64), (np.int64, torch.int64), (np.float16, torch.float16),
            (jnp.bfloat16, torch.bfloat16), (np.float32, torch.float32), (np.float64, torch.float64),
            (np.complex64, torch.complex64), (np.complex128, torch.complex128)]


@pytest.mark.parametrize("dtype, held", ACCEPTED, ids=[np.dtype(d).name for d, _ in ACCEPTED])
def test_placeholder_has_the_dtype_and_shape_the_host_gives_that_array(dtype, held) -> None:
    array = (np.arange(6) % 2).astype(dtype).reshape(2, 3)
    wide = np.dtype(dtype) in (np.int64, np.float64, np.complex128)  # numpy arrays only, outside JAX's x64
    for leaf in (array,) if wide else (array, jnp.asarray(array)):
        given = values.to_torch(leaf)
        stand_in = values.placeholder(values.leaf_key(leaf), {})
        assert (stand_in.dtype, tuple(stand_in.shape)) == (given.dtype, tuple(given.shape)) == (held, (2, 3))
        assert not stand_in.any()
    # the raw mapping is torch's own where torch reads the numpy dtype (all but bfloat16)
    if np.dtype(dtype) != np.dtype(jnp.bfloat16):
        assert torch_dtype(dtype) == torch.from_numpy(np.zeros((), dtype)).dtype


def test_a_dtype_without_a_torch_equivalent_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedDtypeError, match="uint32"):
        values.placeholder(((2,), np.dtype(np.uint32)), {})
