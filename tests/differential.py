"""The differential comparison every end-to-end test uses: converted outputs against the original
torch model's, with the same structure, shapes and dtypes, floats within tolerance, integers exact."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from dycl_jax.lower.dtypes import to_jax_dtype

RTOL, ATOL = 1e-4, 1e-4  # float outputs; integer and bool outputs (tokens, exit ids, flags) must be equal


# torch dtype -> (held as, outside JAX's 64-bit scope; kept as, inside it)
_WIDE = {
    torch.int64: (np.int32, np.int64),
    torch.float64: (np.float32, np.float64),
    torch.complex128: (np.complex64, np.complex128),
}


def allowed_dtypes(want: torch.dtype) -> set[np.dtype]:
    """The JAX dtypes that count as torch's `want`. The documented policy (lower/dtypes.py):
    int64 and float64 are held as int32 and float32, or stay 64-bit in a program that runs in
    JAX's 64-bit scope; every other dtype maps to exactly one JAX dtype."""
    if want in _WIDE:
        return {np.dtype(d) for d in _WIDE[want]}
    return {np.dtype(to_jax_dtype(want))}


def same_dtype(want: Any, got: Any) -> str | None:
    """None when the dtype of `got` (a JAX result) is the policy's dtype for `want` (torch's);
    else what differs. Python numbers in torch's output must stay of their kind."""
    g = np.asarray(got).dtype
    if isinstance(want, torch.Tensor):
        if g not in allowed_dtypes(want.dtype):
            return f"dtype {g} for torch {want.dtype} (allowed: {sorted(map(str, allowed_dtypes(want.dtype)))})"
        return None
    kind = {bool: "b", int: "iu", float: "f"}.get(type(want))
    if kind is not None and g.kind not in kind:
        return f"dtype {g} for a Python {type(want).__name__}"
    return None


def _numpy(v: Any) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        v = v.detach()
        return (v.float() if v.dtype == torch.bfloat16 else v).numpy()  # numpy has no bfloat16
    return np.asarray(v)


def assert_same(want: Any, got: Any, where: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    w_leaves, w_spec = pytree.tree_flatten(want)
    g_leaves, g_spec = pytree.tree_flatten(got)
    assert w_spec == g_spec, f"{where}: output structure {g_spec} != torch's {w_spec}"
    for i, (w_orig, g) in enumerate(zip(w_leaves, g_leaves)):
        problem = same_dtype(w_orig, g)
        assert problem is None, f"{where}: leaf {i} {problem}"
        w, g = _numpy(w_orig), np.asarray(g)
        assert w.shape == g.shape, f"{where}: leaf {i} shape {g.shape} != {w.shape}"
        if w.dtype.kind in "fc":
            np.testing.assert_allclose(g.astype(w.dtype), w, rtol=rtol, atol=atol, err_msg=f"{where}: leaf {i}")
        else:
            np.testing.assert_array_equal(g.astype(np.int64), w.astype(np.int64), err_msg=f"{where}: leaf {i}")
