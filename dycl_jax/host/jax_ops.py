"""Host statements computed by JAX: every ATen op the statement runs is its lowering on concrete arrays.

A host statement is one torch.export could not capture, usually because an output shape or a
Python value depends on data (`nonzero`, `unique`, boolean masks, `.item()`, `allclose`).
Outside a jitted program those sizes are known, so the statement runs as torch code under a
dispatch mode that hands every ATen op to its JAX lowering, applied to concrete arrays (the
data-dependent lowerings compute when their inputs are not traced). torch only supplies each
op's output dtypes, from a fake-tensor run (no data). Values cross as exact copies in 64-bit
JAX, so int64 and float64 keep their width. Anything the mode cannot do exactly (an op
without lowering, an in-place update or `out=` op whose aliasing a copy would lose) raises
`NotInJax`, and the host runs the statement in torch instead, as before; an exception of our
own (`errors.raised_by_us`) inside a lowering is a bug and propagates as itself.
"""
from __future__ import annotations

import contextvars
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.utils._pytree as pytree
from torch._decomp import decomposition_table
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._python_dispatch import TorchDispatchMode

from dycl_jax.errors import raised_by_us
from dycl_jax.host import numpy_ops
from dycl_jax.lower.dtypes import torch_dtype
from dycl_jax.lower.registry import registered

aten = torch.ops.aten

# ops that only hand a tensor through (no computation): run as torch does
_THROUGH = {aten.lift_fresh.default, aten.detach.default, aten.alias.default}


_ACTIVE: contextvars.ContextVar[bool] = contextvars.ContextVar("dycl_jax_ops", default=False)


class NotInJax(Exception):
    """The statement needs something the JAX mode cannot do exactly: run it in torch."""


def _to_array(t: torch.Tensor) -> jax.Array:
    t = t.detach().resolve_conj().resolve_neg()
    if t.dtype == torch.bfloat16:
        return jnp.asarray(t.float().numpy()).astype(jnp.bfloat16)
    if t.dtype not in _DTYPES:
        raise NotInJax(f"tensors of dtype {t.dtype}")
    return jnp.asarray(t.contiguous().numpy())


_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
           torch.float64, torch.complex64, torch.complex128}


def _to_tensor(a: Any, dtype: torch.dtype) -> torch.Tensor:
    a = np.asarray(a)
    if a.dtype == jnp.bfloat16:
        return torch.from_numpy(a.astype(np.float32)).to(dtype)
    out = torch.from_numpy(np.array(a))  # a writable copy
    return out if out.dtype == dtype else out.to(dtype)


_META: dict[Any, Any] = {}
_META_LIMIT = 4096


def _meta_key(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return ("t", v.dtype, tuple(v.shape))
    return (type(v), repr(v))


def _out_dtypes(func: Any, args: tuple, kwargs: dict) -> Any:
    """torch's output dtypes of `func` on these inputs (a tree like the output; None for non-tensors),
    from a fake-tensor run, remembered per op and input metadata."""
    key = (func, tuple(map(_meta_key, pytree.tree_leaves((args, kwargs)))))
    if key in _META:
        return _META[key]
    try:
        with FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True) as mode:
            fake = pytree.tree_map_only(torch.Tensor, mode.from_tensor, (args, kwargs))
            out = func(*fake[0], **fake[1])
        dtypes = pytree.tree_map(lambda o: o.dtype if isinstance(o, torch.Tensor) else None, out)
    except Exception:  # noqa: BLE001  (fake kernels refuse some value-returning ops: the schema decides then)
        dtypes = None
    if len(_META) >= _META_LIMIT:  # shapes that grow call by call (a decode loop) must not grow it forever
        _META.clear()
    _META[key] = dtypes
    return dtypes


def _schema_types(func: Any) -> list[str]:
    return [str(r.type) for r in func._schema.returns]


def _convert_out(func: Any, out: Any, dtypes: Any, first_dtype: torch.dtype | None) -> Any:
    """The lowering's result as torch would return it: tensors in torch's dtypes, Python scalars."""
    kinds = _schema_types(func)
    if len(kinds) == 1:
        return _convert_one(kinds[0], out, dtypes, first_dtype)
    dts = dtypes if isinstance(dtypes, (list, tuple)) else [None] * len(kinds)
    return tuple(_convert_one(k, o, d, first_dtype) for k, o, d in zip(kinds, out, dts))


def _convert_one(kind: str, out: Any, dtype: Any, first_dtype: torch.dtype | None) -> Any:
    if kind == "Tensor":
        return _to_tensor(out, dtype if isinstance(dtype, torch.dtype) else _torch_dtype(out))
    if kind in ("Tensor[]", "List[Tensor]"):
        dts = dtype if isinstance(dtype, (list, tuple)) else [None] * len(out)
        return [_to_tensor(o, d if isinstance(d, torch.dtype) else _torch_dtype(o)) for o, d in zip(out, dts)]
    if kind == "bool":
        return bool(out)
    if kind == "int" or kind == "SymInt":
        return int(out)
    if kind == "float":
        return float(out)
    if kind in ("Scalar", "number"):  # `.item()`: the Python number of the input's dtype
        return _to_tensor(out, first_dtype).item() if first_dtype is not None else np.asarray(out).item()
    raise NotInJax(f"an op returning {kind}")


def _torch_dtype(a: Any) -> torch.dtype:
    return torch_dtype(np.asarray(a).dtype)


@functools.lru_cache(maxsize=None)  # asked per op of every host statement: once per op overload
def _views(func: Any) -> bool:
    """Whether the op's result views its input in torch (a copy here, see `JaxOps._note_views`)."""
    return any(r.alias_info is not None for r in func._schema.returns)


@functools.lru_cache(maxsize=None)
def _name(func: Any) -> str:
    return str(func).removeprefix("aten.")


class JaxOps(TorchDispatchMode):
    """While active, every ATen op runs as its JAX lowering on concrete arrays; `ops` lists them."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self._table = registered()
        self._aliased: set[int] = set()
        self._keep: list[torch.Tensor] = []
        self.roots: dict[int, torch.Tensor] = {}  # id of a view op's result -> the tensor torch's would view

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _THROUGH:
            return func(*args, **kwargs)
        if func in numpy_ops.FORMS:  # small exact ops (`.item()`, masks, nonzero): numpy, no JAX dispatch
            out = numpy_ops.FORMS[func](args, kwargs)
            if out is not None:
                self.ops.append(_name(func))
                self._note_views(func, args, out)
                return out
        if func._schema.is_mutable:
            return self._in_place(func, args, kwargs)
        fn = self._table.get(func)
        if fn is None:
            decomposition = decomposition_table.get(func)
            if decomposition is None:
                raise NotInJax(f"no lowering for {func}")
            with self:
                return decomposition(*args, **kwargs)
        return self._lowered(func, fn, args, kwargs)

    def _in_place(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """`x.op_(...)` as `x.copy_(op(x, ...))`: exact unless `x` shares storage with another
        tensor here (a view this mode computed is a copy, so the update would miss it)."""
        target = args[0] if args else None
        packet = func.overloadpacket.__name__
        functional = getattr(getattr(aten, packet[:-1], None), func._overloadname, None) \
            if packet.endswith("_") and func._overloadname != "out" else None
        if functional is None or functional not in self._table or not isinstance(target, torch.Tensor) \
                or id(target) in self._aliased or target._base is not None:
            raise NotInJax(f"{func} updates a tensor in place")
        out = self._lowered(functional, self._table[functional], args, kwargs)
        target.copy_(out)
        return target

    def _note_views(self, func: Any, args: tuple, out: Any) -> None:
        # a view op's result (and its base) would share storage in torch; here it is a copy
        if _views(func):
            for t in pytree.tree_leaves((args, out)):
                if isinstance(t, torch.Tensor):
                    self._aliased.add(id(t))
                    self._keep.append(t)  # ids stay unique while the statement runs
            base = next((t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)), None)
            if base is not None:
                root = self.roots.get(id(base), base)
                self.roots.update((id(t), root) for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor))

    def _lowered(self, func: Any, fn: Callable, args: tuple, kwargs: dict) -> Any:
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        dtypes = _out_dtypes(func, args, kwargs)
        jargs, jkwargs = pytree.tree_map_only(torch.Tensor, _to_array, (args, kwargs))
        try:
            out = fn(*jargs, **jkwargs)
        except Exception as exc:  # noqa: BLE001  (a lowering that cannot compute this case: torch runs it)
            if raised_by_us(exc):  # a bug in our lowering: it stays itself, never hidden by torch running it
                raise
            raise NotInJax(f"{func}: {type(exc).__name__}: {exc}") from exc
        self.ops.append(_name(func))
        result = _convert_out(func, out, dtypes, tensors[0].dtype if tensors else None)
        self._note_views(func, args, result)
        return result


def run_in_jax(body: Callable[[], Any], roots: dict[int, torch.Tensor] | None = None) -> tuple[Any, list[str]]:
    """`body()` with every ATen op computed by JAX (64-bit scope); its result and the ops it ran.
    `roots`, if given, gets the tensor each view op's result would view in torch (`JaxOps.roots`).
    Raises NotInJax where that cannot be exact."""
    mode = JaxOps()
    if roots is not None:
        mode.roots = roots
    token = _ACTIVE.set(True)
    try:
        with jax.enable_x64(True), mode:
            out = body()
    finally:
        _ACTIVE.reset(token)
    return out, mode.ops


# higher-order ops called eagerly (`torch.cond(...)` in a host statement) compile themselves with
# torch.compile, which refuses to trace under a dispatch mode (and keeps refusing afterwards)
_HIGHER_ORDER = frozenset({"cond", "while_loop", "scan", "map", "associative_scan"})


def calls_higher_order(fns: list[Callable[..., Any]]) -> bool:
    """Whether one of these statement functions names a torch higher-order op: such a statement runs in torch."""
    return any(_names_higher_order(fn.__code__) for fn in fns if hasattr(fn, "__code__"))


@functools.lru_cache(maxsize=4096)  # asked on every call of a host statement: once per code object
def _names_higher_order(code: Any) -> bool:
    inner = [c for c in code.co_consts if hasattr(c, "co_names")]
    return bool(_HIGHER_ORDER & set(code.co_names)) or any(map(_names_higher_order, inner))


def active() -> bool:
    """Whether a statement is being computed by JAX ops (a converted method called from it
    would run its jitted regions inside the 64-bit scope: the host runs such a statement in torch)."""
    return _ACTIVE.get()
