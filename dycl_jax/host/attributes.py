"""Module attributes that the program itself writes (`self.hidden = ...`, `self.saved.append`):
under the dispatch host they are state flowing between regions, so every region takes them as
extra inputs and gives them back as extra outputs instead of baking in a trace-time value."""
from __future__ import annotations

from typing import Any

import torch

_SKIP = {"training"}
Snapshot = list[tuple[dict, str, Any, Any]]  # (module __dict__, key, value, copy of a list/dict's items)


def _watched(key: str) -> bool:
    return not key.startswith("_") and key not in _SKIP


def _copy(v: Any) -> Any:
    if isinstance(v, list):
        return list(v)
    if isinstance(v, dict):
        return dict(v)
    return None


def _plain(x: Any) -> bool:
    if isinstance(x, (tuple, list)):
        return all(map(_plain, x))
    return x is None or type(x) in (int, float, bool, str)


def _same(now: Any, v: Any, copy: Any) -> bool:
    if now is not v:  # export re-creates some config values (conv `stride` tuples): equal is unchanged
        return type(now) is type(v) and _plain(now) and _plain(v) and now == v
    if isinstance(copy, list):
        return len(now) == len(copy) and all(a is b for a, b in zip(now, copy))
    if isinstance(copy, dict):
        return now.keys() == copy.keys() and all(now[k] is copy[k] for k in copy)
    return True


class DynamicAttributes:
    """The (module, attribute) pairs the program writes, found by watching module `__dict__`s."""

    def __init__(self, root: torch.nn.Module):
        self.modules = list(root.modules())
        self.slots: list[tuple[dict, str]] = []
        self.original: list[Any] = []  # each slot's value before the program first wrote it

    def snapshot(self) -> Snapshot:
        return [(m.__dict__, k, v, _copy(v)) for m in self.modules for k, v in m.__dict__.items() if _watched(k)]

    def changed(self, before: Snapshot) -> list[tuple[dict, str, Any]]:
        """(dict, key, value before) of every attribute written since `before`."""
        out = [(d, k, v) for d, k, v, copy in before if not _same(d.get(k), v, copy)]
        known = {(id(d), k) for d, k, _, _ in before}
        for m in self.modules:
            d = m.__dict__
            out += [(d, k, None) for k in d if _watched(k) and (id(d), k) not in known]
        return out

    def restore(self, before: Snapshot) -> None:
        known = {(id(d), k) for d, k, _, _ in before}
        for d, k, v, copy in before:
            d[k] = v
            if isinstance(copy, list):
                v[:] = copy
            elif isinstance(copy, dict):
                v.clear()
                v.update(copy)
        for m in self.modules:
            d = m.__dict__
            for k in [k for k in d if _watched(k) and (id(d), k) not in known]:
                del d[k]

    def register(self, changes: list[tuple[dict, str, Any]]) -> bool:
        """Make the changed attributes slots; True if any is new."""
        known = {(id(d), k) for d, k in self.slots}
        new = [(d, k, v) for d, k, v in changes if (id(d), k) not in known]
        for d, k, v in new:
            self.slots.append((d, k))
            self.original.append(v)
        return bool(new)

    def read(self) -> tuple:
        return tuple(d.get(k) for d, k in self.slots)

    def write(self, values: tuple | list) -> None:
        for (d, k), v in zip(self.slots, values):
            d[k] = v

    def reset(self) -> None:
        """Give the user's model back its attributes as they were before the call."""
        self.write(self.original)
