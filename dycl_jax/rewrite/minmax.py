"""Python's own `max`/`min` over tensors while a program is exported: torch.export replaces the
builtins by `torch.maximum`/`torch.minimum`, which broadcast, promote dtypes and propagate NaN,
while Python returns one of its operands as it is (`max(a, b)` is `b` if `b > a` else `a`)."""
from __future__ import annotations

import builtins
import contextlib
import sys
from typing import Any, Callable, Iterator

import torch

from dycl_jax.errors import DyclError
from dycl_jax.source import origins


def _user_location() -> Any:
    """The first frame outside this module that the origin map knows (the user's line)."""
    frame = sys._getframe(2)
    while frame is not None:
        loc = origins.resolve(frame.f_code.co_filename, frame.f_lineno)
        if loc is not None and loc.file != __file__:
            return loc
        frame = frame.f_back
    return None


def _operand(v: Any, other: Any) -> torch.Tensor:
    """`v` as a tensor; a Python number next to a tensor in that tensor's dtype where the
    conversion keeps how it compares (as torch compares a tensor with a Python scalar)."""
    if isinstance(v, torch.Tensor):
        return v
    if isinstance(other, torch.Tensor) and type(v) in (int, float) and (
            other.dtype.is_floating_point or (type(v) is int and other.dtype not in (torch.bool,))):
        return torch.tensor(v, dtype=other.dtype).expand(other.shape)
    return torch.as_tensor(v)


def _pick(name: str, better: Callable[[Any, Any], Any], a: Any, b: Any) -> Any:
    """Python's choice between `a` (the best so far) and `b`: `b` where `better(b, a)`, else `a`."""
    if not (isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)):
        return b if better(b, a) else a
    ta, tb = _operand(a, b), _operand(b, a)
    if ta.shape != tb.shape or ta.dtype != tb.dtype or ta.numel() != 1:
        raise DyclError(
            f"`{name}(...)` over tensors of different shapes or dtypes ({tuple(ta.shape)} {ta.dtype}, "
            f"{tuple(tb.shape)} {tb.dtype}), or of more than one element: Python returns one operand as it is, "
            "so the result's shape and dtype depend on the data", location=_user_location(),
            fix=f"use torch.maximum/torch.minimum (elementwise), or give `{name}` one-element tensors of one "
                "shape and dtype; or convert with host=\"dispatch\" (the default \"auto\" does so)")
    return torch.where(better(tb, ta), tb, ta)


def _python_order(name: str, better: Callable[[Any, Any], Any], outer: Callable) -> Callable:
    """Python's `max`/`min` where a tensor is among the items; `outer` (the builtin in force
    before, torch.export's for SymInts) for everything else."""
    def chosen(*args: Any, **kwargs: Any) -> Any:
        items = args[0] if len(args) == 1 else args
        if kwargs or isinstance(items, torch.Tensor):  # a key or default, or `max(t)` over a tensor's rows
            return outer(*args, **kwargs)
        try:
            items = list(items)
        except TypeError:
            return outer(*args, **kwargs)  # Python's own error
        if not items or not any(isinstance(v, torch.Tensor) for v in items):
            return outer(items)
        best = items[0]
        for v in items[1:]:
            best = _pick(name, better, best, v)
        return best

    chosen.__name__ = name
    return chosen


@contextlib.contextmanager
def python_builtins() -> Iterator[None]:
    """Python's `max`/`min` over tensors for the duration (inside torch.export, which patches
    the builtins itself, and in the eager tracer's dry runs on fake tensors)."""
    saved = builtins.max, builtins.min
    builtins.max = _python_order("max", lambda b, a: b > a, saved[0])
    builtins.min = _python_order("min", lambda b, a: b < a, saved[1])
    try:
        yield
    finally:
        builtins.max, builtins.min = saved
