"""Module state passed explicitly into staged branch and loop functions.

Branch functions are traced as separate graphs; a parameter they reach through `self` would
otherwise be baked in as a constant. Every parameter, buffer and tensor attribute of the
converted model becomes an operand, and is swapped in while the branch is traced.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from dycl_jax.rewrite import attribute_watch, lazy_state

_ROOTS: list[torch.nn.Module] = []
_SLOTS: dict[int, list[tuple[dict, str]]] = {}  # id(root) -> (container dict, key) per state tensor


def _slots_of(root: torch.nn.Module) -> list[tuple[dict, str]]:
    slots = []
    for m in root.modules():
        for container in (m._parameters, m._buffers):
            slots.extend((container, k) for k, v in container.items() if v is not None)
        slots.extend((m.__dict__, k) for k, v in m.__dict__.items() if isinstance(v, torch.Tensor))
    return slots


@contextlib.contextmanager
def lifted(root: torch.nn.Module) -> Iterator[None]:
    """Make `root`'s state an explicit operand of every staged branch while active."""
    _ROOTS.append(root)
    _SLOTS[id(root)] = _slots_of(root)
    try:
        yield
    finally:
        _ROOTS.pop()
        if all(r is not root for r in _ROOTS):
            _SLOTS.pop(id(root), None)
        if not _ROOTS:
            lazy_state.forget()  # the capture is over: its probes belong to its fake mode
            attribute_watch.forget()


def roots() -> list[torch.nn.Module]:
    """The models whose staged branches are being traced now."""
    return list(_ROOTS)


def current() -> tuple[list[tuple[dict, str]], list[int], list[torch.Tensor]]:
    """(slots, slot → operand index, unique tensors) of the state as it is right now."""
    slots: list[tuple[dict, str]] = []
    seen_slot: set[tuple[int, str]] = set()
    for root in _ROOTS:
        for container, key in _SLOTS[id(root)]:
            if (id(container), key) not in seen_slot and isinstance(container.get(key), torch.Tensor):
                seen_slot.add((id(container), key))
                slots.append((container, key))
    index: list[int] = []
    tensors: list[torch.Tensor] = []
    by_id: dict[int, int] = {}
    for container, key in slots:
        t = container[key]
        if id(t) not in by_id:  # tied weights travel once
            by_id[id(t)] = len(tensors)
            tensors.append(t)
        index.append(by_id[id(t)])
    return slots, index, tensors


@contextlib.contextmanager
def swapped(slots: list[tuple[dict, str]], index: list[int], values: tuple[torch.Tensor, ...]) -> Iterator[None]:
    """Temporarily point every state slot at the branch's own operand."""
    old = [container[key] for container, key in slots]
    try:
        for (container, key), i in zip(slots, index):
            container[key] = values[i]
        yield
    finally:
        for (container, key), value in zip(slots, old):
            container[key] = value
