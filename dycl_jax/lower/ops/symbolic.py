"""Shape arithmetic of dynamic graphs (sym_size, operator.*, torch.sym_*), getitem and runtime asserts.

Backed symbols (sizes of inputs) are plain Python ints while JAX traces, so their arithmetic
runs in Python and stays static. Unbacked symbols (from `.item()`, i.e. _local_scalar_dense)
are traced 0-d arrays: the same operators then build array math.
"""
from __future__ import annotations

import builtins
import math
import operator
from typing import Any, Callable

import jax.numpy as jnp
import torch

from dycl_jax.errors import DyclError
from dycl_jax.lower import registry
from dycl_jax.lower.ops._util import aten, norm_dim
from dycl_jax.lower.registry import register


def _is_array(v: Any) -> bool:
    return hasattr(v, "dtype") and hasattr(v, "shape")


# ---------------------------------------------------------------------------- sizes
@register(aten.sym_size.int)
def sym_size(x, dim):
    return x.shape[norm_dim(dim, x.ndim)]


@register(aten.sym_numel.default)
def sym_numel(x):
    return math.prod(x.shape)


@register(aten.sym_stride.int)
def sym_stride(x, dim):
    # JAX arrays have no strides; every array a graph sees here is treated as contiguous,
    # which is what torch reports for the freshly computed tensors of an exported graph
    return math.prod(x.shape[norm_dim(dim, x.ndim) + 1:])


@register(aten.sym_storage_offset.default)
def sym_storage_offset(x):
    return 0


@register(aten._local_scalar_dense.default)
def local_scalar_dense(x):
    # `.item()`: the value stays a 0-d array inside the traced program (reading it on the host
    # would break jit); ops that consume it accept 0-d arrays where torch passes a number
    return x.reshape(())


# ---------------------------------------------------------------------------- Python operators
@register(operator.getitem)
def getitem(obj, index):
    return obj[index]  # an element of a multi-output op's tuple, or of a Python list/tuple


def _py_or_array(py_fn: Callable[..., Any], array_fn: Callable[..., Any]) -> Callable[..., Any]:
    def lower(*args):
        return array_fn(*args) if any(_is_array(a) for a in args) else py_fn(*args)

    return lower


# These agree between Python numbers and JAX arrays (jnp's // and % follow Python's floor
# semantics, which are also sympy's for SymInt).
for _fn in (
    operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv, operator.mod,
    operator.pow, operator.neg, operator.pos, operator.abs,
    operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge,
    operator.and_, operator.or_, operator.xor,
):  # fmt: skip
    register(_fn)(_fn)

register(operator.not_)(_py_or_array(operator.not_, jnp.logical_not))
register(operator.truth)(_py_or_array(operator.truth, lambda v: jnp.asarray(v) != 0))


# ---------------------------------------------------------------------------- torch.sym_* / math
def _sym_float(v):
    return v.astype(jnp.float32) if _is_array(v) else float(v)


def _sym_int(v):
    return jnp.trunc(v).astype(jnp.int32) if _is_array(v) else int(v)


def _sym_ite(cond, a, b):
    return jnp.where(cond, a, b) if _is_array(cond) else (a if cond else b)


def _sym_sum(values):
    return sum(values[1:], values[0]) if values else 0


# torch functions and math/builtins that exported graphs call on SymInt/SymFloat values
_TORCH_SYM: dict[Any, Callable[..., Any]] = {
    torch.sym_float: _sym_float,
    torch.sym_int: _sym_int,
    torch.sym_max: _py_or_array(builtins.max, jnp.maximum),
    torch.sym_min: _py_or_array(builtins.min, jnp.minimum),
    torch.sym_not: _py_or_array(operator.not_, jnp.logical_not),
    torch.sym_ite: _sym_ite,
    torch.sym_sum: _sym_sum,
    torch._sym_sqrt: _py_or_array(math.sqrt, jnp.sqrt),
    math.floor: _py_or_array(math.floor, lambda v: jnp.floor(v).astype(jnp.int32)),
    math.ceil: _py_or_array(math.ceil, lambda v: jnp.ceil(v).astype(jnp.int32)),
    math.trunc: _sym_int,
    builtins.round: _py_or_array(builtins.round, lambda v, nd=None: jnp.round(v)),
}

# registry._check_target accepts only `operator` functions, ATen overloads and higher-order
# ops; these targets are registered once the registry lists them among its Python targets.
if all(t in registry._PY_TARGETS for t in _TORCH_SYM):
    for _target, _lowering in _TORCH_SYM.items():
        register(_target)(_lowering)


# ---------------------------------------------------------------------------- asserts, no-ops
@register(aten._assert_scalar.default)
def assert_scalar(cond, msg):
    # export's runtime checks on symbols: decidable now when the symbol is a backed size
    if isinstance(cond, (bool, int)) and not cond:
        raise DyclError(
            f"a shape check recorded by torch.export fails for these inputs: {msg}",
            fix="call the converted model with shapes the exported program accepts",
        )
    return None  # an unbacked (data-dependent) condition cannot be checked inside jit


@register(aten._assert_tensor_metadata.default)
def assert_tensor_metadata(a, size=None, stride=None, dtype=None, *, device=None, layout=None):
    return None  # torch's own consistency check of the traced metadata; nothing to compute


@register(aten.sym_constrain_range.default, aten.sym_constrain_range_for_size.default)
def sym_constrain_range(size, *, min=None, max=None):  # noqa: A002 (ATen argument names)
    return None  # value-range hints for the symbolic shape solver; no runtime effect


@register(aten._assert_async.default, aten._assert_async.msg)
def assert_async(cond, msg=None):
    return None  # a device-side assert torch runs asynchronously; not checkable inside jit
