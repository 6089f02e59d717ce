"""Captures one dispatch region (a Python callable over a model's state) for one input signature."""
from __future__ import annotations

import contextlib
import time
import types
import warnings
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import jax
import numpy as np
import torch
from torch.export import ExportedProgram

from dycl_jax.capture.export import StateEntry, _eval_mode, _quiet_torch_logs, _state_entries
from dycl_jax.errors import CaptureError

# Python values a captured region may return as constants of its input signature.
_CONSTANT_TYPES = (int, float, bool, complex, str, bytes, type(None), type(Ellipsis), range, slice, type,
                   torch.dtype, torch.device, torch.Size, np.generic, torch.nn.Module, types.FunctionType,
                   types.MethodType, types.BuiltinFunctionType)


class HostValueError(CaptureError):
    """The region returns a value computed from tensor data (e.g. `.item()`) or an object that
    cannot be a constant of its input shapes: it runs on the host instead."""


@dataclass
class CapturedRegion:
    """A region's graph for one input signature, and how to rebuild its outputs."""

    ep: ExportedProgram
    state: list[StateEntry]
    out_tree: Any  # jax treedef of the region's outputs
    slots: list[int | None]  # per output leaf: index among the graph's outputs, None for a constant
    constants: list[Any]  # per output leaf: the constant (where slots[i] is None)
    seconds: float


class _CallWrapper(torch.nn.Module):
    """forward(*tensor leaves) = fn(*args) with the non-tensor leaves of args baked in."""

    def __init__(self, root: torch.nn.Module, fn: Callable, leaves: list[Any], tree: Any, sink: dict):
        super().__init__()
        self.m = root  # the model's state is lifted under `m.`, i.e. under its torch paths
        self._fn, self._leaves, self._tree, self._sink = fn, leaves, tree, sink
        self._index = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        leaves = list(self._leaves)
        for i, t in zip(self._index, tensors):
            leaves[i] = t.clone()  # in-place updates of an input stay inside the region
        out = self._fn(*jax.tree_util.tree_unflatten(self._tree, leaves))
        flat, tree = jax.tree_util.tree_flatten(out)
        slots: list[int | None] = []
        constants: list[Any] = []
        results: list[torch.Tensor] = []
        for v in flat:
            if isinstance(v, torch.Tensor):
                slots.append(len(results))
                constants.append(None)
                results.append(v)
            elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                raise HostValueError(f"a Python value computed from tensor data ({type(v).__name__} {v})")
            elif isinstance(v, _CONSTANT_TYPES):
                slots.append(None)
                constants.append(v)
            else:
                raise HostValueError(f"a {type(v).__name__} object, which is not a tensor or a Python constant")
        self._sink.update(tree=tree, slots=slots, constants=constants)
        return tuple(results)


def capture_call(root: torch.nn.Module, fn: Callable, args: tuple, context: Callable[[], ContextManager]) -> CapturedRegion:
    """Export `fn(*args)` (static shapes; tensors in `args` are example inputs) and decompose it.

    `context` is entered around export (the host's rewrite patches and staging mode). Errors
    propagate as raised: the host decides which of them move the region to the host.
    """
    leaves, tree = jax.tree_util.tree_flatten(args)
    sink: dict[str, Any] = {}
    wrapper = _CallWrapper(root, fn, leaves, tree, sink)
    tensors = tuple(leaves[i] for i in wrapper._index)
    start = time.perf_counter()
    with warnings.catch_warnings(), _quiet_torch_logs(), contextlib.ExitStack() as stack:
        warnings.simplefilter("ignore")
        stack.enter_context(context())
        stack.enter_context(_eval_mode(root))  # warnings are off here: to_jax warned once already
        ep = torch.export.export(wrapper, tensors)
        ep = ep.run_decompositions()
    return CapturedRegion(ep, _state_entries(ep), sink["tree"], sink["slots"], sink["constants"],
                          time.perf_counter() - start)

