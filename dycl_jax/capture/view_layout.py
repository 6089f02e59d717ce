"""How a view sits in the memory of the tensor it views: what a capture needs to make it again as a view of that tensor."""
from __future__ import annotations

from typing import Any, NamedTuple

import torch


class Layout(NamedTuple):
    """`view` is `base.as_strided(size, stride, base.storage_offset() + offset)` (strides count
    storage elements, so they hold for any tensor of the storage); `contiguous`: the base is laid
    out in order from its offset, so a fresh tensor of its values has the same storage layout."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    contiguous: bool
    detached: bool = False  # `.detach()`: no gradient flows from the view to the base


def make(base: torch.Tensor, at: Layout) -> torch.Tensor:
    """The view at `at` of `base` (a tensor laid out as the base it stands for)."""
    view = base.as_strided(at.size, at.stride, base.storage_offset() + at.offset)
    return view.detach() if at.detached else view


def layout(view: torch.Tensor, base: torch.Tensor) -> Layout | None:
    """The view's layout in its base's memory, or None where a size, stride or offset is symbolic
    (no one layout for every call) or the dtypes differ."""
    parts = [*view.shape, *view.stride(), view.storage_offset(), base.storage_offset()]
    if not all(type(p) is int for p in parts) or view.dtype != base.dtype:
        return None
    return Layout(tuple(view.shape), tuple(view.stride()), view.storage_offset() - base.storage_offset(),
                  base.is_contiguous(), base.requires_grad and not view.requires_grad)


def view_layouts(inputs: list[Any], outputs: list[Any], pairs: tuple[tuple[int, str, int], ...]) -> tuple:
    """Per view pair (capture/region.view_pairs) `(k, kind, j)`: output k's layout in input or
    output leaf j, or None."""
    found: list[Layout | None] = []
    for k, kind, j in pairs:
        base = inputs[j] if kind == "in" else outputs[j]
        view = outputs[k]
        ok = isinstance(view, torch.Tensor) and isinstance(base, torch.Tensor)
        found.append(layout(view, base) if ok else None)
    return tuple(found)
