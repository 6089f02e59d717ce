"""Buffer updates made inside staged branches (train-mode BatchNorm), as branch outputs.

torch.cond and torch.while_loop refuse a branch that updates a tensor in place, and a
BatchNorm in training mode updates its running statistics. Inside a branch being traced the
update rebinds the module's state slot to the new tensor instead; the branch then returns the
new values of every slot some branch of the construct wrote (the old value where this branch
did not), and after the cond the slots are written with its outputs, in place at the top level
(which torch.export records as a buffer mutation) or rebound again inside an outer branch.
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
    with torch.no_grad():
        container[key].copy_(value)


def inside_branch() -> bool:
    """Whether a staged branch is being traced right now."""
    return _WRITTEN.get() is not None
