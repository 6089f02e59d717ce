"""Host reads: a statement `n = t.tolist()`, `n = [int|float|bool](t.item())`, `sel = t.nonzero()` or
`sel = t.nonzero(as_tuple=True)[k]` or `y = t[mask]` of an array (the dispatch rewrite leaves reads in that form,
rewrite/converters/host_reads.py), read with numpy.

The statement gives a Python value, or an array whose size depends on the data, so it always runs
on the host. Run as a host statement it would cross into torch and back op by op (~250 µs in a
decode loop); numpy gives torch's values: `.tolist()`/`.item()` turn every element into the Python
int, float or bool of its exact value (an int64 tensor the host holds as int32 has the same
values), `nonzero` lists the indices of the nonzero elements in the same row-major order, and a
bool mask of the leading shape selects the same elements in the same order.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from dycl_jax.host.values import ARRAYS
from dycl_jax.lower.dtypes import INT32_MAX
from dycl_jax.rewrite.converters.host_reads import ReadForm

# dtypes whose numpy elements become the Python values torch gives (bfloat16 and complex go
# the usual way, through torch)
_PLAIN = frozenset(np.dtype(d) for d in ("bool", "int8", "int16", "int32", "int64", "uint8",
                                          "float16", "float32", "float64"))
_WRAP = {"int": int, "float": float, "bool": bool}
NOT_READ = object()  # this value is not read here: the statement runs as a host statement
# per read method, the ATen ops a host statement doing it would run (`.tolist()` runs none)
OPS = {"tolist": (), "item": ("_local_scalar_dense.default",), "nonzero": ("nonzero.default",),
       "mask": ("index.Tensor",)}


def _array(value: Any) -> np.ndarray | None:
    """`value` as numpy where it is an array of a plain dtype outside any JAX transformation."""
    if not isinstance(value, ARRAYS) or isinstance(value, jax.core.Tracer) \
            or np.dtype(value.dtype) not in _PLAIN:
        return None
    return np.asarray(value)


def read(form: ReadForm, value: Any, mask: Any = None) -> Any:
    """The statement's value for the array `value` (and `mask`, for `value[mask]`), or NOT_READ
    (not an array of a plain dtype, inside a JAX transformation, a 0-d `nonzero`, an index that
    is not a bool mask of the leading shape, or a read torch refuses: torch's own error then)."""
    arr = _array(value)
    if arr is None:
        return NOT_READ
    if form.method == "mask":
        m = _array(mask)
        if m is None or m.dtype != np.bool_ or m.ndim == 0 or m.shape != arr.shape[:m.ndim]:
            return NOT_READ
        return arr[m]  # a copy, in the dtype the host holds `value` in, as a host statement gives it
    if form.method == "nonzero":
        return _nonzero(arr, form.index)
    if form.method == "item":
        if arr.size != 1:
            return NOT_READ
        out = arr.reshape(()).item()
    else:
        out = arr.tolist()
    return _WRAP[form.wrapper](out) if form.wrapper else out


def _nonzero(arr: np.ndarray, index: int | None) -> Any:
    """torch's int64 indices as the host holds them: int32 where they fit (values.to_host_value)."""
    if arr.ndim == 0 or index is not None and not -arr.ndim <= index < arr.ndim:
        return NOT_READ  # 0-d inputs follow other rules in torch; a bad index raises torch's error
    found = np.argwhere(arr) if index is None else np.nonzero(arr)[index]
    wide = found.size and int(found.max()) > INT32_MAX
    return found.astype(np.int64 if wide else np.int32)
