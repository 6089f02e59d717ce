"""Buffer updates made inside staged branches and loops (train-mode BatchNorm), as outputs.

torch.cond and torch.while_loop refuse a branch that updates a tensor in place, and a
BatchNorm in training mode updates its running statistics. Inside a branch or loop body being
traced the update rebinds the module's state slot to the new tensor instead; a branch then
returns the new values of every slot some branch of the construct wrote (the old value where
this branch did not), a loop carries them (each iteration reads the last one's), and after the
construct the slots are written with its outputs: in place at the top level (which torch.export
records as a buffer mutation), or rebound again inside an outer branch or loop, so an update
flows out through every level of nesting.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

import torch

# the (id(container), key) of every slot written in the innermost branch being traced
_WRITTEN: contextvars.ContextVar[set | None] = contextvars.ContextVar("dycl_branch_writes", default=None)


@contextlib.contextmanager
def in_branch() -> Iterator[set]:
    """Mark the code run inside as a staged branch's body (writes rebind, not mutate); yields
    the set of slots written there."""
    written: set = set()
    token = _WRITTEN.set(written)
    try:
        yield written
    finally:
        _WRITTEN.reset(token)


def write(container: dict, key: str, value: torch.Tensor) -> None:
    """Set the state tensor `container[key]` (a module's `_buffers` entry) to `value`."""
    written = _WRITTEN.get()
    if written is not None:
        container[key] = value
        written.add((id(container), key))
        return
    # detached rather than copied under no_grad (a buffer update has no gradient either way): a
    # no_grad region makes torch.export's set-grad pass split the graph around it, and that pass
    # loses the subgraphs of nested conds ("no attribute 'true_graph_0'"). A loop's outputs
    # require grad when any carry does, its statistics too.
    container[key].copy_(value.detach())

