"""numpy forms of the small ATen ops host statements run (`.item()`, comparisons, masks, `nonzero`, row picks).

A host statement computed by JAX ops (jax_ops.py) pays, per op, a fake-tensor dtype lookup, a
device transfer, an eager JAX dispatch and a copy back: about 300 µs for one `.item()`. These
ops are exact in numpy on the tensors' own memory, so `JaxOps` runs them here first. Each form
gives torch's result exactly (dtype included: comparisons compute in torch's promoted dtype,
integers stay int64) or `None` where it cannot promise that (a dtype numpy lacks, an integer
scalar outside the promoted dtype, an index out of range), and the op takes the JAX path.
Results are fresh tensors, never views of an input, as the JAX path's are.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

aten = torch.ops.aten

_NUMPY_DTYPES = {torch.bool: np.bool_, torch.uint8: np.uint8, torch.int8: np.int8, torch.int16: np.int16,
                 torch.int32: np.int32, torch.int64: np.int64, torch.float16: np.float16,
                 torch.float32: np.float32, torch.float64: np.float64, torch.complex64: np.complex64,
                 torch.complex128: np.complex128}


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)  # not fake or other subclass tensors


def _array(t: Any) -> np.ndarray | None:
    """The tensor's values as numpy (its own memory where it can be: read only here), or None."""
    if type(t) not in _PLAIN_TENSORS or t.dtype not in _NUMPY_DTYPES or t.device.type != "cpu":
        return None
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    return t.detach().numpy()


def _tensor(a: Any) -> torch.Tensor:
    """A fresh torch tensor of a numpy result (never sharing an input's memory)."""
    return torch.from_numpy(np.array(a))


def _item(args: tuple, kwargs: dict) -> Any:
    a = _array(args[0])
    if a is None or a.size != 1:
        return None
    return a.reshape(()).item()  # torch's .item(): bool, int or float (float32 widened exactly), complex


def _operand(v: Any, dtype: torch.dtype) -> np.ndarray | None:
    """A comparison's operand in torch's promoted dtype, or None where that cast is not torch's."""
    np_dtype = _NUMPY_DTYPES[dtype]
    if isinstance(v, torch.Tensor):
        a = _array(v)
        if a is None:
            return None
        if a.dtype.kind in "iub" and np.dtype(np_dtype).kind in "iu" and a.size \
                and not np.can_cast(a.dtype, np_dtype):  # a wrapped scalar may not fit: torch keeps its value
            info = np.iinfo(np_dtype)
            if not (info.min <= int(a.min()) and int(a.max()) <= info.max):
                return None
        return a.astype(np_dtype, copy=False)
    if type(v) is bool or type(v) is float or type(v) is complex:
        if type(v) is complex and not dtype.is_complex:
            return None
        return np.asarray(v).astype(np_dtype)
    if type(v) is int:
        if dtype.is_floating_point or dtype.is_complex:
            return np.asarray(float(v)).astype(np_dtype) if abs(v) < 2 ** 53 else None
        if dtype == torch.bool:
            return None
        info = np.iinfo(np_dtype)  # torch compares an out-of-range int scalar by value: leave it to JAX
        return np.asarray(v, dtype=np_dtype) if info.min <= v <= info.max else None
    return None


def _compare(ufunc: Callable, ordered: bool) -> Callable[[tuple, dict], Any]:
    def run(args: tuple, kwargs: dict) -> Any:
        if kwargs or len(args) != 2:
            return None
        a, b = args
        if _array(a) is None or (isinstance(b, torch.Tensor) and _array(b) is None):
            return None
        common = torch.result_type(a, b)
        if common not in _NUMPY_DTYPES or ordered and common.is_complex:
            return None
        x, y = _operand(a, common), _operand(b, common)
        if x is None or y is None:
            return None
        return _tensor(ufunc(x, y))
    return run


def _arith(ufunc: Callable) -> Callable[[tuple, dict], Any]:
    """`a + b`, `a - b`, `a * b` in torch's promoted dtype (integers wrap as torch's do; one IEEE
    rounding for floats); `alpha` only where it is 1 (torch multiplies by it first)."""
    def run(args: tuple, kwargs: dict) -> Any:
        if len(args) != 2 or kwargs and (set(kwargs) != {"alpha"} or kwargs["alpha"] != 1):
            return None
        a, b = args
        if _array(a) is None or (isinstance(b, torch.Tensor) and _array(b) is None):
            return None
        common = torch.result_type(a, b)
        if common not in _EXACT_ARITH:
            return None
        x, y = _operand(a, common), _operand(b, common)
        if x is None or y is None:
            return None
        with np.errstate(all="ignore"):  # int64 wraps around in torch too; inf - inf is nan there too
            return _tensor(np.asarray(ufunc(x, y), dtype=_NUMPY_DTYPES[common]))
    return run


# dtypes whose add/sub/mul give torch's bits in numpy (float16 and bool are left to JAX)
_EXACT_ARITH = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float32, torch.float64}


def _logical(ufunc: Callable, arity: int) -> Callable[[tuple, dict], Any]:
    def run(args: tuple, kwargs: dict) -> Any:
        if kwargs or len(args) != arity:
            return None
        arrays = [_array(t) for t in args]
        if any(a is None for a in arrays):
            return None
        return _tensor(ufunc(*arrays))
    return run


def _reduce_bool(ufunc: Callable) -> Callable[[tuple, dict], Any]:
    """`t.any()` / `t.all()` over every element: torch's result is uint8 for a uint8 input, else bool."""
    def run(args: tuple, kwargs: dict) -> Any:
        if kwargs or len(args) != 1:
            return None
        a = _array(args[0])
        if a is None:
            return None
        out = ufunc(a)
        return _tensor(np.asarray(out, dtype=np.uint8 if a.dtype == np.uint8 else np.bool_))
    return run


def _nonzero(args: tuple, kwargs: dict) -> Any:
    a = _array(args[0]) if len(args) == 1 and not kwargs else None
    if a is None or a.ndim == 0:
        return None
    return _tensor(np.argwhere(a).astype(np.int64, copy=False))  # torch's [count, ndim] int64


def _dim(a: np.ndarray, dim: Any) -> int | None:
    if type(dim) is not int or not -a.ndim <= dim < a.ndim:
        return None
    return dim % a.ndim


def _select(args: tuple, kwargs: dict) -> Any:
    if kwargs or len(args) != 3:
        return None
    a = _array(args[0])
    if a is None or a.ndim == 0:
        return None
    dim, index = _dim(a, args[1]), args[2]
    if dim is None or type(index) is not int or not -a.shape[dim] <= index < a.shape[dim]:
        return None
    return _tensor(np.take(a, index, axis=dim))


def _unbind(args: tuple, kwargs: dict) -> Any:
    if kwargs or len(args) > 2:
        return None
    a = _array(args[0])
    if a is None or a.ndim == 0:
        return None
    dim = _dim(a, args[1] if len(args) > 1 else 0)
    if dim is None:
        return None
    return [_tensor(r) for r in np.moveaxis(a, dim, 0)]


def _slice(args: tuple, kwargs: dict) -> Any:
    if kwargs or not 1 <= len(args) <= 5:
        return None
    a = _array(args[0])
    if a is None or a.ndim == 0:
        return None
    dim, start, end, step = (list(args[1:]) + [0, None, None, 1][len(args) - 1:])[:4]
    dim = _dim(a, dim)
    if dim is None or not all(v is None or type(v) is int for v in (start, end)) or type(step) is not int or step < 1:
        return None
    return _tensor(a[(slice(None),) * dim + (slice(start, end, step),)])  # Python's clamping, as torch's


FORMS: dict[Any, Callable[[tuple, dict], Any]] = {
    aten._local_scalar_dense.default: _item,
    **{getattr(aten, name).Tensor: _compare(ufunc, ordered) for name, ufunc, ordered in
       [("eq", np.equal, False), ("ne", np.not_equal, False), ("lt", np.less, True), ("le", np.less_equal, True),
        ("gt", np.greater, True), ("ge", np.greater_equal, True)]},
    **{getattr(aten, name).Scalar: _compare(ufunc, ordered) for name, ufunc, ordered in
       [("eq", np.equal, False), ("ne", np.not_equal, False), ("lt", np.less, True), ("le", np.less_equal, True),
        ("gt", np.greater, True), ("ge", np.greater_equal, True)]},
    **{getattr(aten, name).Tensor: _arith(ufunc) for name, ufunc in
       [("add", np.add), ("sub", np.subtract), ("mul", np.multiply)]},
    **{getattr(aten, name).Scalar: _arith(ufunc) for name, ufunc in
       [("add", np.add), ("sub", np.subtract), ("mul", np.multiply)]},
    aten.logical_and.default: _logical(np.logical_and, 2),
    aten.logical_or.default: _logical(np.logical_or, 2),
    aten.logical_xor.default: _logical(np.logical_xor, 2),
    aten.logical_not.default: _logical(np.logical_not, 1),
    aten.any.default: _reduce_bool(np.any),
    aten.all.default: _reduce_bool(np.all),
    aten.nonzero.default: _nonzero,
    aten.select.int: _select,
    aten.unbind.int: _unbind,
    aten.slice.Tensor: _slice,
}


def run(func: Any, args: tuple, kwargs: dict) -> Any:
    """`func(*args, **kwargs)` computed by numpy, or None where this op has no exact numpy form here."""
    form = FORMS.get(func)
    return None if form is None else form(args, kwargs)
