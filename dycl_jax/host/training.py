"""Train mode on the dispatch host: region programs draw from a key per region call and return
their buffer updates, which the host writes into the model state before the next region runs.

torch updates a BatchNorm's running statistics in place, so a later statement (and the next
call) reads the new values. A region captured in training mode returns the buffers it updated
as its first graph outputs (capture/region.py); `Updating` writes them into the host's state
list, which every later region reads its state from. Each region call gets `fold_in(key, n)`,
n counting the region calls of this host call: the same key and inputs take the same path and
draw the same numbers, and each iteration of a host loop is another call, so another mask.
Host statements (code torch.export could not capture) run outside any key and outside the JAX
state, so one that draws random numbers or updates a buffer is refused, located.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import jax
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dycl_jax.errors import DyclError, Location
from dycl_jax.lower.keys import key_stream


class RegionKeys:
    """The key of one host call and the number of region calls made with it so far."""

    __slots__ = ("key", "count")

    def __init__(self, key: Any) -> None:
        self.key = key
        self.count = 0

    def next(self) -> int:
        n = self.count
        self.count += 1
        return n


def keyed(run: Callable[[list, list], Any]) -> Callable[[list, list, Any, int], Any]:
    """`run(state, tensors)` with its random ops drawing from `fold_in(key, n)` (traced inside
    the jitted program, so a region call costs no extra dispatch)."""

    def fn(state: list, tensors: list, key: Any, n: Any) -> Any:
        with key_stream(None if key is None else jax.random.fold_in(key, n)):
            return run(state, tensors)

    return fn


class Updating:
    """A region's keyed program as the host calls it, `(state inputs, tensors) -> outputs`:
    draws the next region key and writes the updated buffers (the first `len(targets)` graph
    outputs) into the host's state at `targets`. With `margins`, the program returns
    (outputs, margins) and both lose the update entries."""

    __slots__ = ("host", "program", "targets", "margins")

    def __init__(self, host: Any, program: Callable, targets: tuple[int, ...], margins: bool = False) -> None:
        self.host, self.program, self.targets, self.margins = host, program, targets, margins

    def __call__(self, inputs: list, tensors: list) -> Any:
        keys: RegionKeys = self.host._keys
        result = self.program(inputs, tensors, keys.key, keys.next())
        k = len(self.targets)
        outs, margins = result if self.margins else (result, None)
        if k:
            state = self.host._state
            for i, value in zip(self.targets, outs[:k]):
                state[i] = value
            outs = outs[k:]
            margins = margins[k:] if margins is not None else None
        return (outs, margins) if self.margins else outs


def state_index(root: torch.nn.Module, path_index: dict[str, int]) -> dict[str, int]:
    """`path_index` plus every other name of the same tensor (a module registered twice), so a
    region reading or updating a buffer under its second name uses the one state entry."""
    named = [*root.named_parameters(remove_duplicate=False), *root.named_buffers(remove_duplicate=False)]
    first: dict[int, int] = {}
    for name, t in named:
        if name in path_index:
            first.setdefault(id(t), path_index[name])
    return {**{name: first[id(t)] for name, t in named if id(t) in first}, **path_index}


def update_targets(mutations: Sequence[str], index: dict[str, int], label: str) -> tuple[int, ...]:
    """The host state entries of the buffers a region updates (torch.export names only the
    model's own buffers, each of which has an entry: a missing one is our bug, not a fallback)."""
    missing = [m for m in mutations if m not in index]
    if missing:
        raise AssertionError(f"{label} updates {missing[0]}, which has no host state entry")
    return tuple(index[m] for m in mutations)


class HostGuard(TorchDispatchMode):
    """Around a host statement in train mode: refuse a random op (it would draw from torch's
    generator, not the call's key) and an in-place update of a model buffer (a BatchNorm's
    statistics, which live in the JAX state), before either runs."""

    def __init__(self, buffers: frozenset[int], where: Location, reason: str | None) -> None:
        super().__init__()
        self.buffers, self.where, self.reason = buffers, where, reason

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags:
            self._refuse(f"draws random numbers ({func})",
                         "draw the random values at a shape that does not depend on tensor data (e.g. at the "
                         "full size, then select), or pass them in as an input")
        if func._schema.is_mutable:
            for a, v in zip(func._schema.arguments, list(args) + [kwargs.get(a.name) for a in
                                                                     func._schema.arguments[len(args):]]):
                if a.alias_info is not None and a.alias_info.is_write and id(v) in self.buffers:
                    self._refuse(f"updates a model buffer in place ({func}; a BatchNorm in training mode "
                                 "updates its running statistics)",
                                 "apply the BatchNorm to a tensor whose shape does not depend on data (e.g. "
                                 "normalise all rows, then select), or convert for inference (train=False)")
        return func(*args, **kwargs)

    def _refuse(self, what: str, fix: str) -> None:
        why = f" ({self.reason})" if self.reason else ""
        raise DyclError(f"{os.path.basename(self.where.file)}:{self.where.line}: this statement runs on the host"
                        f"{why} and {what}; in a train=True conversion only compiled regions draw from the "
                        "call's key and update the JAX state", location=self.where, fix=fix)


def model_buffers(root: torch.nn.Module) -> frozenset[int]:
    return frozenset(id(b) for _, b in root.named_buffers(remove_duplicate=False))
