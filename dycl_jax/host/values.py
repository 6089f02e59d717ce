"""Host values of the dispatch host: signature keys, torch <-> JAX conversion at host
statements, and the classification of why a region could not be compiled."""
from __future__ import annotations

import collections.abc
import datetime
import re
import types
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

from dycl_jax.capture.ordered_dicts import keep_order
from dycl_jax.errors import DataDependentError, UnsupportedDtypeError, UnsupportedOpError, exception_chain, raised_by_us
from dycl_jax.lower.dtypes import INT32_MAX, INT32_MIN, tensor_to_numpy, torch_dtype
from dycl_jax.rewrite.plan import Undefined

_ARRAY = type(jnp.zeros(()))
JAX_ARRAY = _ARRAY  # the concrete array type (a tracer is not one)
ARRAYS = (jax.Array, np.ndarray)  # what a tensor is on the host: a JAX array, or a numpy input
_NONE = type(None)
_PLAIN = (int, bool, str, bytes, _NONE, torch.dtype, torch.device, range, slice, type(Ellipsis))
PLAIN = frozenset((*_PLAIN, float))  # immutable Python values (a leaf of these is never shared state)
_SYMBOLIC = ("symbolic int",)


def same_arrays(leaves: list) -> tuple[tuple[int, int], ...]:
    """(i, j) for each array leaf i that is the same object as an earlier leaf j: names bound to
    one tensor (`a = v`), which an in-place update must change together."""
    first: dict[int, int] = {}
    pairs = []
    for i, v in enumerate(leaves):
        if isinstance(v, ARRAYS):
            j = first.setdefault(id(v), i)
            if j != i:
                pairs.append((i, j))
    return tuple(pairs)


def placeholder(key: Any, modules: dict[int, torch.nn.Module]) -> Any:
    """A value standing for a signature leaf (`leaf_key`) when a part is captured again: zeros
    for an array, as torch holds it (an int32 array is torch int64, as `to_torch` gives it), the
    module of that id (`modules`), else the value the key holds."""
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], tuple):
        return torch.zeros(key[0], dtype=torch_dtype(key[1], held=True))
    kind, value = key
    if kind == "id":
        return modules[value]
    if kind is Undefined:
        return Undefined(value)
    return float.fromhex(value) if kind is float else value


def leaf_key(v: Any) -> Any:
    """What a compiled region specialises on: shape and dtype of arrays, value of Python values."""
    t = type(v)
    if t is _ARRAY or t is np.ndarray:  # exact types first: the usual leaf
        return (v.shape, v.dtype)
    # how another type is keyed is decided once per exact type (the isinstance checks against
    # jax.Array's ABC and torch.nn.Module cost about 1 µs per leaf on every call otherwise)
    kind = _KINDS.get(t)
    if kind is None:
        kind = _KINDS[t] = _kind(t)
    if kind is _ARRAY_KEY:
        return (v.shape, v.dtype)
    if kind is _VALUE_KEY:
        return (t, v)
    if kind is _MODULE_KEY:
        return ("id", id(v))
    if t is float:
        return (t, v.hex())  # NaN equals itself here
    if t is Undefined:
        return (t, v.name)
    if isinstance(v, np.generic):
        return (t, v.item())
    if isinstance(v, types.FunctionType):
        # a nested function made anew on every call: the same code over the same values is one key
        cells = tuple(leaf_key(c.cell_contents) for c in v.__closure__ or ())
        return ("fn", v.__code__, cells, id(v.__globals__))
    if isinstance(v, types.MethodType):
        return ("method", v.__func__, id(v.__self__))
    if isinstance(v, tuple):  # namedtuples and the like that pytree did not open
        return (t, tuple(map(leaf_key, v)))
    if live(v):  # never a compiled program's constant (DispatchHost._first_call): its id says nothing
        return ("live", t)
    try:
        hash(v)
    except TypeError:
        return ("id", id(v))
    if t.__hash__ is object.__hash__:
        return ("id", id(v))
    return (t, v)


# leaf_key's per-type decision: keyed by shape and dtype, by value (the immutable Python types
# it keys exactly by type), by identity (modules), or by the value-dependent rules after them
_ARRAY_KEY, _VALUE_KEY, _MODULE_KEY, _OTHER_KEY = "array", "value", "module", "other"
_KINDS: dict[type, str] = {}


def _kind(t: type) -> str:
    if t is _ARRAY or t is np.ndarray:
        return _ARRAY_KEY
    if t in _PLAIN:
        return _VALUE_KEY
    if t is float or t is Undefined:
        return _OTHER_KEY
    if issubclass(t, ARRAYS):
        return _ARRAY_KEY
    if issubclass(t, torch.nn.Module):
        return _MODULE_KEY
    return _OTHER_KEY


_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))


def live(v: Any) -> bool:
    """Whether `v` is an iterator (zip, enumerate, map, a generator...: reading it consumes it)
    or a dict view (it follows its dict): a program cannot take or give it as a constant, and a
    probe run cannot read it without changing what the real run sees."""
    return isinstance(v, (collections.abc.Iterator, *_VIEWS))


def scalars_left_out(key: tuple) -> tuple:
    """A `call_key` signature with the values of its int, float, bool, str and datetime leaves left out (their types kept)."""
    tree, keys, grad, same = key
    return tree, tuple((k[0],) if type(k) is tuple and len(k) == 2 and k[0] in _SCALARS else k for k in keys), grad, same


# immutable values a wall-clock reading gives (`start = datetime.now()`: new at every call, as a float reading is)
DATES = (datetime.datetime, datetime.date, datetime.timedelta)
_SCALARS = (int, float, bool, str, *DATES)


def call_key(vals: tuple, attrs: tuple | None, grad: bool | None = None) -> tuple[list, Any, tuple]:
    """(leaves, tree, signature key) of a part's inputs `vals` and module attribute values
    `attrs`: key = (tree, leaf keys, grad mode (torch's now, unless `grad` says), aliased array
    leaves). Tensors among the leaves become JAX arrays and nested functions with closures open
    into their values (Closure)."""
    grad = torch.is_grad_enabled() if grad is None else grad
    if attrs is None:
        # the usual call: every input one pytree leaf of a type seen before (arrays, modules,
        # ints): no flattening, and the types decide which leaves are arrays
        kinds = _FLAT.get(tuple(map(type, vals)), False)
        if kinds is False:
            kinds = _flat_kinds(vals)
        if kinds is not None and (kinds[2] is None or not any(vals[i] for i in kinds[2])):
            tree, arrays, lists = kinds
            leaves = list(vals) if lists is None else [v for i, v in enumerate(vals) if i not in lists]
            keys = tuple([leaf_key(v) for v in leaves])
            same = same_arrays(leaves) if arrays > 1 else ()
            return leaves, tree, (tree, keys, grad, same)
    leaves, tree = jax.tree_util.tree_flatten(keep_order((vals, attrs)))  # dicts keep their key order
    if has_closures(leaves):  # what nested functions close over becomes region input
        opened = jax.tree_util.tree_map(open_closures, keep_order((vals, attrs)))
        leaves, tree = jax.tree_util.tree_flatten(keep_order(opened))
    if has_tensors(leaves):
        leaves = [to_jax(v) if isinstance(v, torch.Tensor) else v for v in leaves]
    return leaves, tree, (tree, tuple(map(leaf_key, leaves)), grad, same_arrays(leaves))


# per tuple of input types: None where the general path must run (a container, None, a tensor,
# a function), else the tree of `(vals, None)`, how many leaves are arrays, and the positions of
# lists, which hold no leaves when empty (an appended list goes into a part empty: appends.py),
# else None. (Pytree nodes are registered by type; a type registered only after its first use
# here would stay a leaf.)
_FLAT: dict[tuple[type, ...], tuple[Any, int, frozenset[int] | None] | None] = {}


def _flat_kinds(vals: tuple) -> tuple[Any, int, frozenset[int] | None] | None:
    types_ = tuple(map(type, vals))
    lists = frozenset(i for i, t in enumerate(types_) if t is list)
    # the types' tree, taken with every list empty (a call with a non-empty list takes the general path)
    probe = tuple([] if i in lists else v for i, v in enumerate(vals))
    flat = all(not issubclass(t, (torch.Tensor, types.FunctionType)) for t in types_) \
        and jax.tree_util.all_leaves([v for i, v in enumerate(vals) if i not in lists])
    kinds = _FLAT[types_] = (jax.tree_util.tree_structure((probe, None)),
                             sum(issubclass(t, ARRAYS) for t in types_), lists or None) if flat else None
    return kinds


def symbolic_key(key: tuple, leaves: list, symbolic: frozenset[int]) -> tuple:
    """`key` (tree, leaf keys, grad mode, aliased leaves) without the values of the int leaves in
    `symbolic` (those a program takes as symbolic inputs; one out of int32's non-negative range
    keeps its value)."""
    tree, keys, grad, same = key
    keys = list(keys)
    for i in symbolic:
        v = leaves[i]
        if type(v) is int and 0 <= v <= INT32_MAX:
            keys[i] = _SYMBOLIC
    return tree, tuple(keys), grad, same


class Closure:
    """A nested user function seen by a region: its closure's values become region inputs (as
    a pytree node), so a function closing over a tensor works in compiled and host regions."""

    __slots__ = ("fn",)

    def __init__(self, fn: types.FunctionType):
        self.fn = fn


def _cell(c: types.CellType) -> Any:
    try:
        return c.cell_contents
    except ValueError:  # an empty cell: a name the function reads before it was assigned
        return Undefined("<free variable>")


def _flatten_closure(c: Closure) -> tuple[list, tuple]:
    fn = c.fn
    children = [open_closures(_cell(cell)) for cell in fn.__closure__]
    _GLOBALS[id(fn.__globals__)] = fn.__globals__  # module namespaces: aux data must be hashable
    return children, (fn.__code__, fn.__name__, id(fn.__globals__), fn.__defaults__)


def _unflatten_closure(aux: tuple, children: list) -> types.FunctionType:
    code, fn_name, globals_id, defaults = aux
    return types.FunctionType(code, _GLOBALS[globals_id], fn_name, defaults, tuple(types.CellType(v) for v in children))


_GLOBALS: dict[int, dict] = {}


jax.tree_util.register_pytree_node(Closure, _flatten_closure, _unflatten_closure)


def open_closures(v: Any) -> Any:
    """`v` with each nested function that closes over values wrapped as a Closure node."""
    if isinstance(v, types.FunctionType) and v.__closure__:
        try:
            hash(v.__defaults__)
        except TypeError:
            return v  # unhashable defaults: keyed by identity as before
        return Closure(v)
    return v


def has_closures(leaves: list) -> bool:
    return types.FunctionType in map(type, leaves) and any(type(v) is types.FunctionType and v.__closure__
                                                           for v in leaves)


def has_tensors(leaves: list) -> bool:
    """Whether any leaf is a torch tensor (by type, remembered: leaves repeat a few types)."""
    for t in set(map(type, leaves)):
        verdict = _TENSOR_TYPE.get(t)
        if verdict is None:
            verdict = _TENSOR_TYPE[t] = issubclass(t, torch.Tensor)
        if verdict:
            return True
    return False


_TENSOR_TYPE: dict[type, bool] = {}


def to_jax(v: Any) -> Any:
    """A tensor as the JAX array dycl_jax uses for it (int64 -> int32 with a range check)."""
    if isinstance(v, jax.Array):
        return v
    if isinstance(v, torch.Tensor):
        if v.dtype == torch.int64 and v.numel() and not INT32_MIN <= int(v.min()) <= int(v.max()) <= INT32_MAX:
            # beyond int32: stays an int64 numpy array; regions it enters run with 64-bit integers
            return v.detach().cpu().numpy()
        return jnp.asarray(tensor_to_numpy(v, "a tensor computed on the host"))
    if isinstance(v, np.ndarray):
        if v.dtype in (np.int64, np.float64, np.uint64):  # narrowed as torch's int64/float64 would be
            v = tensor_to_numpy(torch.from_numpy(np.ascontiguousarray(v)), "an input array")
        return jax.device_put(v)
    return v


def to_host_value(v: Any) -> Any:
    """A value a host statement gives, as the host passes it on: a tensor becomes a numpy array in
    the dtype `to_jax` gives (int64 -> int32 where it fits, else it stays int64), not a device
    array, since a jitted region takes numpy directly (`to_jax`'s device put and torch range
    check cost about 40 µs per tensor). The method's own outputs become JAX arrays (`outputs_to_jax`)."""
    if isinstance(v, torch.Tensor):
        if v.dtype == torch.int64 and v.numel():
            a = v.detach().cpu().numpy()
            if not (INT32_MIN <= a.min() and a.max() <= INT32_MAX):
                return a.copy()  # beyond int32: regions it enters run with 64-bit integers
        return tensor_to_numpy(v, "a tensor computed on the host")  # (a copy: torch may update v later)
    return to_jax(v)


def tree_to_host(tree: Any) -> Any:
    return jax.tree_util.tree_map(to_host_value, keep_order(tree))  # dicts keep their key order


def outputs_to_jax(out: Any) -> Any:
    """The method's result with numpy arrays (host statements' results, inputs handed through) as
    JAX arrays, as the staged host returns them; the usual result, JAX arrays or a flat tuple of
    them, is returned as it is."""
    t = type(out)
    if t is _ARRAY or t is tuple and all(type(v) is _ARRAY for v in out):
        return out
    leaves, tree = jax.tree_util.tree_flatten(keep_order(out))
    if not any(map(_device_bound, leaves)):
        return out
    return jax.tree_util.tree_unflatten(tree, [jax.device_put(v) if _device_bound(v) else v for v in leaves])


def _device_bound(v: Any) -> bool:
    # 64-bit arrays stay numpy: they hold int64 values beyond int32 (to_host_value), which a
    # device array outside JAX's 64-bit mode would narrow
    return type(v) is np.ndarray and v.dtype.itemsize < 8 or type(v) is np.ndarray and v.dtype == np.complex64


def to_host(t: torch.Tensor) -> np.ndarray:
    """A tensor input as the numpy array the host passes around (int64 -> int32, range-checked)."""
    return tensor_to_numpy(t, "an input tensor")


def to_torch(v: Any) -> Any:
    """A JAX array as the torch tensor the user's code expects (int32 arrays are torch int64)."""
    if not isinstance(v, ARRAYS):
        return v
    a = np.asarray(v)
    if a.dtype == np.int32:
        return torch.from_numpy(a.astype(np.int64))
    if a.dtype == jnp.bfloat16:
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.array(a))  # a writable copy: torch code may update it in place


def tree_to_jax(tree: Any) -> Any:
    return jax.tree_util.tree_map(to_jax, keep_order(tree))  # dicts keep their key order


def tree_to_torch(tree: Any) -> Any:
    return jax.tree_util.tree_map(to_torch, keep_order(tree))


# ---------------------------------------------------------------- why a region did not compile

def reraise_if_internal(exc: BaseException) -> None:
    """Our own bugs (a NameError raised inside dycl_jax) must surface, never become a fallback;
    so must a missing lowering, which the user should hear about rather than run in torch, and a
    dtype JAX lacks, which the host could not hold either."""
    for e in exception_chain(exc):
        if isinstance(e, (UnsupportedOpError, UnsupportedDtypeError)):
            raise e
    if raised_by_us(exc):
        raise exc


def unholdable(exc: BaseException) -> bool:
    """Whether the failure is a dtype JAX lacks: no host version can hold its values either."""
    return any(isinstance(e, UnsupportedDtypeError) for e in exception_chain(exc))


# torch.export's exceptions for a guard or an output on a value computed from tensor data
_UNBACKED = ("GuardOnDataDependentSymNode", "DataDependentOutputException", "PendingUnbackedSymbolNotFound")


def data_dependent(exc: BaseException) -> bool:
    """Whether the failure is a shape or Python value decided by tensor data: its symbols are
    torch's unbacked ones, so exporting the part's Python ints as constants cannot remove it."""
    return any(isinstance(e, DataDependentError) or type(e).__name__ in _UNBACKED for e in exception_chain(exc))


def describe_failure(exc: BaseException, limit: int = 300) -> str:
    """One line: the innermost informative cause, in our words where it is torch.export's
    data-dependent guard (its own text is a page of advice about torch internals)."""
    root = exception_chain(exc)[-1]
    text = " ".join(str(root).split())
    guard = _GUARD.search(text)
    if guard is not None and guard.group(1) == "guard on":
        return (f"a tensor's value decides a Python value or a size here (torch.export cannot capture "
                f"`{guard.group(2)}`, a condition on data)")
    if guard is not None:
        return (f"a tensor's value is used as a Python int here (torch.export cannot make the data-dependent "
                f"`{guard.group(2)}` a constant)")
    return f"{type(root).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


_GUARD = re.compile(r"Could not (guard on|extract specialized integer from) data-dependent expression (.+?) "
                    r"\(unhinted")


def failing_statement(exc: BaseException, fns: Sequence[Any]) -> int | None:
    """Index of the statement function whose frame is in the traceback (outermost first)."""
    codes = {fn.__code__: i for i, fn in enumerate(fns)}
    for e in exception_chain(exc):
        tb = e.__traceback__
        while tb is not None:
            i = codes.get(tb.tb_frame.f_code)
            if i is not None:
                return i
            tb = tb.tb_next
    return None
