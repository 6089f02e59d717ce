"""Tensors built only from Python constants (`torch.tensor(1)` flags): values known while tracing."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._mode_utils import no_dispatch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

_LIFTS = (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)


class Tracker(TorchDispatchMode):
    """The eager mirror of the fake tensor mode's constants (see `value`) while tracing: the real
    tensors built only from Python constants, by the same rules, so the eager run decides at
    trace time exactly the branches the staged program decides at trace time."""

    def __init__(self) -> None:
        super().__init__()
        self.known = WeakIdKeyDictionary()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        ins = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if any(isinstance(t, FakeTensor) for t in ins + outs):  # a dry run: the fake mode keeps these
            return out
        computed = func in _LIFTS or (
            bool(ins) and all(t in self.known for t in ins) and isinstance(func, torch._ops.OpOverload)
            and torch.Tag.nondeterministic_seeded not in func.tags
            and (torch.Tag.inplace_view not in func.tags or func is torch.ops.aten.detach_.default))
        if computed and all(t.numel() <= 1 for t in outs):
            for t in outs:
                self.known[t] = True
        else:  # written with a value it cannot compute: so is every view of the same storage
            written = {t.untyped_storage().data_ptr() for t in outs if t.layout == torch.strided}
            for t in [t for t in self.known.keys() if t.untyped_storage().data_ptr() in written]:
                del self.known[t]
        return out


_tracker: Tracker | None = None


@contextlib.contextmanager
def tracked() -> Iterator[None]:
    """Track constant-built tensors for the duration (the eager tracing mode)."""
    global _tracker
    previous, _tracker = _tracker, Tracker()
    try:
        with _tracker:
            yield
    finally:
        _tracker = previous


def value(x: Any) -> torch.Tensor | None:
    """The real value of a one-element tensor that depends on no input or state, else None.

    Staged (under torch.export) and in dry runs, tensors are fake, and the fake tensor mode
    keeps the value of those it can compute (`FakeTensor.constant`): it sets one on
    `torch.tensor(<Python value>)` and on the outputs of deterministic ops whose tensor inputs
    all have one, and clears it when an op writes a value it cannot compute into one. Inputs,
    parameters and buffers never have one, nor do the outputs of torch.cond / torch.while_loop.
    """
    if isinstance(x, FakeTensor):
        c = x.constant
    elif isinstance(x, torch.Tensor) and _tracker is not None and x in _tracker.known:
        c = x
    else:
        return None
    return c if c is not None and c.numel() == 1 else None


def static(x: Any) -> Any:
    """`x`, or its Python truth value when it is a constant-built tensor (see `value`): a branch
    on such a tensor is decided by the program's source, so it runs as Python."""
    c = value(x)
    if c is None:
        return x
    with no_dispatch():  # read the real value without recording anything in the graph
        return bool(c)


def opaque(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a copy of it that is no constant: the value of a graph op's output, which the
    trace does not know (a dry run or the eager mirror stands for it with one path's value)."""
    if value(t) is None:
        return t
    copy = t.clone()
    if isinstance(copy, FakeTensor):
        copy.constant = None
    elif _tracker is not None:
        _tracker.known.pop(copy, None)
    return copy


def fake(mode: FakeTensorMode, t: torch.Tensor) -> torch.Tensor:
    """A dry run's fake of a real tensor; a tracked constant stays one (on a private copy, as the
    fake mode computes in place on it)."""
    if value(t) is None:
        return mode.from_tensor(t)
    with no_dispatch():
        copy = t.clone()
    return mode.fake_tensor_converter.from_real_tensor(mode, copy, make_constant=True)


class ConstTensor:
    """An output leaf that is the same constant-built tensor on every path: recreated after the
    join as a fresh constant, so later branches on it are still decided while tracing."""

    __slots__ = ("data", "dtype", "device")

    def __init__(self, c: torch.Tensor) -> None:
        with no_dispatch():
            self.data, self.dtype, self.device = c.tolist(), c.dtype, c.device

    def make(self) -> torch.Tensor:
        return torch.tensor(self.data, dtype=self.dtype, device=self.device)


def same_constant(values: list[Any]) -> ConstTensor | None:
    """The common value when every one of `values` is a constant-built tensor with the same
    dtype, shape and value, else None."""
    consts = [value(v) for v in values]
    if not consts or any(c is None for c in consts):
        return None
    first = consts[0]
    with no_dispatch():
        if any(c.dtype != first.dtype or c.shape != first.shape or not torch.equal(c, first) for c in consts[1:]):
            return None
    return ConstTensor(first)
