"""Dry-run output plans of branch constructs and loops, reused by eager traces with an equal key."""
from __future__ import annotations

import collections
import types
import weakref
from typing import Any, Callable

import torch
from torch._subclasses.fake_tensor import FakeTensor

from dycl_jax.rewrite import constants, modes
from dycl_jax.rewrite.plan import Undefined
from dycl_jax.rewrite.sites import Site

# While tracing, `operators._choose` dry-runs every path of a tensor-decided construct on fake
# tensors to plan its outputs (about 0.2 s for a ResNet-sized forward). A fake run sees no data:
# what it computes depends only on the branch functions (their code, defaults, closure cells and
# the globals their code names, helpers followed the same way), the construct's inputs (Python
# values by value, tensors by shape, strides, dtype, device, grad flag, constant value and which
# inputs are the same tensor or views of one), every module reachable from those (its Python
# attributes, parameters and buffers, its class's plain attributes), grad mode and the default
# dtype. The key below is all of that, so an equal key gives the plan the dry run would compute.
# Anything the key cannot describe by value (an object of another kind, a fake tensor) makes the
# call uncacheable: it is dry-run as before. Library callables (torch, builtins) and this
# package's own module globals are taken as fixed. Objects named by identity (modules, classes,
# library callables, the site) are held by weak reference in the entry where they allow one: a
# dead one means its id may be reused, and the entry is dropped.

_SIZE = 1024  # entries kept (least recently used dropped): one per construct and input signature
_CACHE: collections.OrderedDict[tuple, tuple[Any, list]] = collections.OrderedDict()
_SCALARS = (bool, int, float, complex, str, bytes, type(None))
_CONTAINERS = (list, tuple, dict, collections.OrderedDict, collections.defaultdict, collections.Counter, set, frozenset)


class _Uncacheable(Exception):
    """A value the key cannot describe."""


class _Keyer:
    """Builds one key: `seen` numbers every object already described (aliases, cycles);
    `pins` are the objects the key names by identity."""

    def __init__(self) -> None:
        self.seen: dict[int, int] = {}
        self.pins: list[Any] = []
        self.tensors: dict[int, int] = {}  # id of a tensor's storage root -> its first number

    def pin(self, x: Any) -> int:
        self.pins.append(x)
        return id(x)

    def key(self, x: Any) -> Any:
        if type(x) in _SCALARS:
            return (type(x).__name__, repr(x) if isinstance(x, (float, complex)) else x)
        k = self.seen.get(id(x))
        if k is not None:
            return ("again", k)  # the same object as an earlier one (aliases are part of the key)
        self.seen[id(x)] = len(self.seen)  # numbers, not ids: equal keys for equal calls
        if isinstance(x, torch.Tensor):
            return self._tensor(x)
        if isinstance(x, Undefined):
            return ("undefined", x.name)
        if type(x) in _CONTAINERS:
            if isinstance(x, dict):
                return (type(x).__name__, tuple((self.key(k), self.key(v)) for k, v in x.items()))
            items = sorted(x, key=repr) if isinstance(x, (set, frozenset)) else x
            return (type(x).__name__, tuple(self.key(v) for v in items))
        if isinstance(x, torch.nn.Module):
            # its attributes, less the empty internal tables (hooks, ...) every module has
            return ("module", self.pin(x), self.key(type(x)),
                    tuple((n, self.key(v)) for n, v in vars(x).items()
                          if not (n[0] == "_" and type(v) in _CONTAINERS and not v)))
        if isinstance(x, types.CodeType):
            return ("code", x)  # by value (code objects compare by their bytecode, constants, names)
        if isinstance(x, weakref.ref):
            return ("weakref", self.key(x()))
        if isinstance(x, (types.ModuleType, types.BuiltinFunctionType, torch.dtype, torch.device,
                          torch._ops.OpOverload, torch._ops.OpOverloadPacket, Site)) or callable(x) and _library(x):
            return ("fixed", self.pin(x))  # immutable, or library code
        if isinstance(x, types.FunctionType):  # by value: generated branch functions are new on every call
            code = x.__code__
            ours = _ours(x)  # this package's wrappers (padding, exits): their module globals are fixed
            return ("function", self.key(code), self.key(x.__defaults__), self.key(x.__kwdefaults__),
                    tuple(self.key(c.cell_contents) if _filled(c) else ("empty",) for c in x.__closure__ or ()),
                    () if ours else tuple((n, self.key(x.__globals__[n])) for n in _names(code) if n in x.__globals__))
        if isinstance(x, types.MethodType):
            return ("method", self.key(x.__self__), self.key(x.__func__))
        if isinstance(x, type):
            return ("class", self.pin(x), self._class_values(x))
        raise _Uncacheable(type(x).__name__)

    def _tensor(self, t: torch.Tensor) -> tuple:
        if isinstance(t, FakeTensor) or t.layout != torch.strided:
            raise _Uncacheable("fake or non-strided tensor")
        root = t._base if t._base is not None else t
        shares = self.tensors.setdefault(id(root), len(self.tensors))
        c = None if isinstance(t, torch.nn.Parameter) else constants.value(t)  # a parameter is no constant
        return ("tensor", type(t).__name__, tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.device,
                t.requires_grad, t.is_conj(), t.is_neg(), shares, modes.is_caller_tensor(t),
                None if c is None else (c.dtype, tuple(c.shape), c.tolist()))

    def _class_values(self, cls: type) -> tuple:
        """A class's plain attributes (`THRESHOLD = 0.5`), along its user-code bases."""
        out = []
        for c in cls.__mro__:
            if not _library(c):
                out.extend((c.__name__, n, self.key(v)) for n, v in vars(c).items()
                           if type(v) in _SCALARS or type(v) in (tuple, frozenset))
        return tuple(out)


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _names(code: types.CodeType) -> list[str]:
    """Global names a code object (and the code nested in it: lambdas, comprehensions) may read."""
    out = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out.extend(_names(c))
    return list(dict.fromkeys(out))


def _library(x: Any) -> bool:
    """Library code, taken as fixed (this package's own functions are described by value:
    they make closures per call)."""
    module = getattr(x, "__module__", None) or ""
    return module.split(".")[0] in ("torch", "builtins", "numpy", "functools", "typing", "abc", "collections",
                                    "math", "operator") or (_ours(x) and not isinstance(x, types.FunctionType))


def _ours(x: Any) -> bool:
    return (getattr(x, "__module__", None) or "").split(".")[0] == "dycl_jax"


def key(site: Site, what: tuple, fns: Any, inputs: Any) -> tuple[tuple, list] | None:
    """The key of one dry run of `fns` on `inputs` (`what`: the operator's own Python arguments),
    with the objects it names, or None if it cannot be described."""
    keyer = _Keyer()
    try:
        k = (id(site), what, torch.is_grad_enabled(), torch.get_default_dtype(), keyer.key(fns), keyer.key(inputs))
    except (_Uncacheable, RecursionError):  # RecursionError: a structure too deep to describe
        return None
    keyer.pin(site)
    return k, keyer.pins


def lookup(k: tuple) -> Any:
    """The plan stored under `k`, if every object its key names is still alive."""
    entry = _CACHE.get(k)
    if entry is None:
        return None
    value, refs = entry
    if any(r() is None for r in refs):
        del _CACHE[k]
        return None
    _CACHE.move_to_end(k)
    return value


def store(k: tuple, pins: list[Any], value: Any) -> None:
    refs, strong = [], []
    for p in pins:
        try:
            refs.append(weakref.ref(p))
        except TypeError:
            strong.append(p)
    _CACHE[k] = (value, refs) if not strong else (value, refs + [_Strong(strong)])
    if len(_CACHE) > _SIZE:
        _CACHE.popitem(last=False)


class _Strong:
    """Holds the objects without weak references (dtypes, builtins) alive with the entry."""

    __slots__ = ("objects",)

    def __init__(self, objects: list[Any]) -> None:
        self.objects = objects

    def __call__(self) -> Any:
        return self


def clear() -> None:
    _CACHE.clear()


def reuse(site: Site, what: tuple, fns: Any, inputs: Any, plan: Callable[[], Any]) -> Any:
    """The plan stored for this dry run's key, else `plan()` (stored when the key is known)."""
    described = key(site, what, fns, inputs)
    found = lookup(described[0]) if described is not None else None
    if found is None:
        found = plan()
        if described is not None:
            store(*described, found)
    return found
