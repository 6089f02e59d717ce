"""torch ↔ JAX dtype mapping and the int64 policy (int32 unless a program needs 64 bits)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from dycl_jax.errors import DyclError, UnsupportedDtypeError

# Policy: torch int64 becomes int32 and float64 becomes float32, unless the program may hold
# an int64 value outside int32 or computes in float64 (lower/int_ranges.py decides): such a
# program is built and run inside `jax.enable_x64(True)`, a scope around its own calls only
# (the process-wide setting is the user's), where int64 and float64 stay 64-bit. Values that do not fit are never wrapped silently:
# constants and Python ints outside the integer width in use raise `DyclError` (`check_int32`).
_TO_JAX: dict[torch.dtype, jnp.dtype] = {
    torch.float32: jnp.float32,
    torch.float64: jnp.float32,
    torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.int64: jnp.int32,
    torch.int32: jnp.int32,
    torch.int16: jnp.int16,
    torch.int8: jnp.int8,
    torch.uint8: jnp.uint8,
    torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64,
    torch.complex128: jnp.complex64,
}

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def to_jax_dtype(dtype: torch.dtype | None) -> jnp.dtype | None:
    """The JAX dtype used for a torch dtype (None stays None)."""
    if dtype is None:
        return None
    if dtype in (torch.int64, torch.float64) and wide_ints():
        return jnp.dtype(jnp.int64 if dtype == torch.int64 else jnp.float64)
    if dtype in _TO_JAX:
        return jnp.dtype(_TO_JAX[dtype])
    if dtype == torch.complex32:
        raise UnsupportedDtypeError(
            "this makes a torch.complex32 tensor (complex numbers of float16 parts: `.chalf()`, or torch.complex "
            "and view_as_complex of float16 tensors); JAX has no complex32 dtype (its smallest complex type is "
            "complex64)", fix="build the complex value from float32 parts (`.float()` on them first), "
            "which gives complex64")
    raise UnsupportedDtypeError(f"torch dtype {dtype} has no JAX equivalent in dycl_jax")


# numpy (and JAX) dtypes of host arrays -> the torch dtype of a tensor holding the same values
_FROM_NUMPY: dict[np.dtype, torch.dtype] = {
    np.dtype(np.bool_): torch.bool,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.float16): torch.float16,
    np.dtype(jnp.bfloat16): torch.bfloat16,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
    np.dtype(np.complex64): torch.complex64,
    np.dtype(np.complex128): torch.complex128,
}


def torch_dtype(dtype: object, held: bool = False) -> torch.dtype:
    """The torch dtype of an array dtype. With `held`, the dtype of the torch value a host array
    stands for: an int32 array holds a torch int64 (`_TO_JAX`), as `host/values.to_torch` gives it."""
    d = np.dtype(dtype)
    if held and d == np.int32:
        return torch.int64
    found = _FROM_NUMPY.get(d)
    if found is None:
        raise UnsupportedDtypeError(f"array dtype {d} has no torch equivalent in dycl_jax",
                                    fix="use one of " + ", ".join(str(t).removeprefix("torch.") for t in _FROM_NUMPY.values()))
    return found


def wide_ints() -> bool:
    """Whether torch.int64 is int64 here: inside a program's `jax.enable_x64(True)` scope."""
    return bool(jax.config.jax_enable_x64)


def int64() -> jnp.dtype:
    """The JAX dtype of torch.int64 here: int32, or int64 inside a 64-bit scope."""
    return to_jax_dtype(torch.int64)


def check_int32(value: int, what: str = "integer constant") -> int:
    """Return `value` if it fits int32 (int64 in a 64-bit scope); otherwise raise instead of
    overflowing silently."""
    if wide_ints():
        if not -(2**63) <= value < 2**63:
            raise DyclError(f"{what} {value} does not fit int64", fix="keep integer values within ±2**63")
        return value
    if not INT32_MIN <= value <= INT32_MAX:
        raise DyclError(
            f"{what} {value} does not fit int32, which dycl_jax uses for torch.int64 "
            "(JAX's 64-bit mode is off)",
            fix="keep integer values within ±2**31 or compute them in floating point",
        )
    return value


def tensor_to_numpy(t: torch.Tensor, what: str = "tensor constant") -> np.ndarray:
    """A torch tensor as a numpy array in the dtype dycl_jax uses for it, checking int64 range."""
    t = t.detach().cpu()
    dtype = to_jax_dtype(t.dtype)  # first: a dtype JAX lacks is refused before numpy is asked
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(jnp.bfloat16)
    arr = t.resolve_conj().resolve_neg().numpy() if t.is_complex() else t.numpy()
    if t.dtype == torch.int64 and arr.size and not wide_ints():
        lo, hi = int(arr.min()), int(arr.max())
        check_int32(lo if lo < INT32_MIN else hi, what)
    return arr.astype(dtype)
