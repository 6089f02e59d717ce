"""Operators for host-side Python over tensor values (converters/tensor_data.py, host_values.py):
in plain mode they do exactly what the user's code does; staged or traced, they keep tensors
tensors, since a staged tensor has no value Python or numpy could read."""
from __future__ import annotations

import sys
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from dycl_jax.errors import DyclError
from dycl_jax.rewrite import modes, plan as plans
from dycl_jax.rewrite.constants import static
from dycl_jax.source import origins

_TORCH_REDUCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "argmax": torch.argmax, "argmin": torch.argmin, "max": torch.max, "amax": torch.max,
    "min": torch.min, "amin": torch.min, "sum": torch.sum, "mean": torch.mean}


def _traced() -> bool:
    return modes.current() != "plain"


def data(x: Any) -> Any:
    """`x.data`: the same values as `x.detach()`, which torch.export can trace (`.data` it cannot)."""
    if isinstance(x, torch.Tensor) and _traced():
        return x.detach()
    return x.data


def np_reduce(fn: Callable, x: Any) -> Any:
    """`np.argmax(x)` and other whole-array numpy reductions of a tensor or a list of them:
    the torch reduction (same value, first index on ties) when staged or traced."""
    has_tensor = any(isinstance(v, torch.Tensor) for v in plans.flatten(x)[0])
    if _traced() and has_tensor and fn.__name__ in _TORCH_REDUCTIONS:
        t = x if isinstance(x, torch.Tensor) else torch.stack([torch.as_tensor(v) for v in x])
        return _TORCH_REDUCTIONS[fn.__name__](t)
    return fn(x)


def item_operand(x: Any) -> Any:
    """`x.item()` as an element of a numpy index reduction (converters/host_values.py): staged or
    traced, the one-element tensor itself (np_reduce stacks it); eager, the Python number."""
    if isinstance(x, torch.Tensor) and _traced() and x.numel() == 1:
        return x.reshape(())
    return x.item()


_LIST_FIX = "keep the list elements tensors of one shape and dtype (or index it with a Python int)"
_SELECTION = "; a list indexed by a tensor becomes a selection among its elements"


def _error(what: str, fix: str, depth: int = 2) -> DyclError:
    caller = sys._getframe(depth)  # the generated line, mapped back to the user's
    return DyclError(what, location=origins.resolve(caller.f_code.co_filename, caller.f_lineno), fix=fix)


def getitem(seq: Any, index: Any) -> Any:
    """`seq[index]`; a Python list or tuple indexed by a one-element integer (or bool) tensor
    (staged, its value is unknown) becomes a selection from the stacked elements, leaf by leaf."""
    if not (isinstance(index, torch.Tensor) and _traced() and index.numel() == 1
            and not index.dtype.is_floating_point and not index.dtype.is_complex):
        return seq[index]
    if isinstance(seq, torch.nn.Module):
        raise _error(f"a {type(seq).__name__} is indexed by a tensor; a staged program cannot pick a module "
                     "by a value it computes", "index modules with a Python int (e.g. the loop counter)")
    if not isinstance(seq, (list, tuple)) or not seq:
        return seq[index]
    flats = [plans.flatten(v) for v in seq]
    spec = flats[0][1]
    if any(s != spec for _, s in flats):
        raise _error(f"the elements of a list of {len(seq)} differ in structure{_SELECTION}", _LIST_FIX)
    i = index.reshape(1).to(torch.int64) % len(seq)  # Python's negative indices
    picked = []
    for k in range(len(flats[0][0])):
        column = [leaves[k] for leaves, _ in flats]
        first = column[0]
        if all(plans.same_python(first, v) for v in column[1:]):
            picked.append(first)
            continue
        for v in column:
            if not (isinstance(v, torch.Tensor) and isinstance(first, torch.Tensor) and v.dtype == first.dtype
                    and plans.same_shape(tuple(v.shape), tuple(first.shape))):
                raise _error(f"list elements are {plans.describe(first)} and {plans.describe(v)}{_SELECTION}",
                             _LIST_FIX)
        picked.append(torch.index_select(torch.stack(column), 0, i).squeeze(0))
    return pytree.tree_unflatten(picked, spec)


def and_value(a: Any, b_fn: Callable[[], Any]) -> Any:
    """`a and b` whose result is used as a value: `b` if `a` is true, else `a` (an operand, as in
    Python); for a one-element tensor `a` when staged, a select between the two operands."""
    return _select_operand(a, b_fn, when_true="b")


def or_value(a: Any, b_fn: Callable[[], Any]) -> Any:
    """`a or b` whose result is used as a value: `a` if `a` is true, else `b`."""
    return _select_operand(a, b_fn, when_true="a")


def _select_operand(a: Any, b_fn: Callable[[], Any], when_true: str) -> Any:
    known = static(a) if _traced() else a
    if not (isinstance(known, torch.Tensor) and _traced() and known.numel() == 1):
        # Python values, constant-built tensors, eager runs: Python's own short-circuit
        # (a tensor of several elements raises torch's own "ambiguous" error here, as in torch)
        if when_true == "a":
            return a if known else b_fn()
        return b_fn() if known else a
    b = b_fn()
    if not (isinstance(b, torch.Tensor) and b.dtype == a.dtype and tuple(b.shape) == tuple(a.shape)):
        raise _value_error(a, b)
    truth = a.reshape(()) != 0
    return torch.where(truth, a, b) if when_true == "a" else torch.where(truth, b, a)


def _value_error(a: torch.Tensor, b: Any) -> DyclError:
    what = f"{type(b).__name__}" if not isinstance(b, torch.Tensor) else f"{b.dtype} {list(b.shape)}"
    return _error(f"`and`/`or` used as a value picks an operand by the tensor's value, and the operands "
                  f"differ ({a.dtype} {list(a.shape)} and {what}): one XLA program cannot return either",
                  'convert with host="auto" (the default) or host="dispatch", or write '
                  "`torch.where(a != 0, a, b)` with operands of one shape and dtype", depth=4)
