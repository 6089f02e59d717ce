"""Module attributes that the program itself writes (`self.hidden = ...`, `self.saved.append`):
under the dispatch host they are state flowing between regions, so every region takes them as
extra inputs and gives them back as extra outputs instead of baking in a trace-time value. The
globals of the model's code are watched too, but only to be refused where they change (see
`global_changes`): a global is shared by reference with every module that imported it, which a
slot's new value would not reach."""
from __future__ import annotations

import operator
from itertools import chain
from dataclasses import dataclass
from typing import Any

import torch

from dycl_jax.rewrite.attribute_watch import identical, kept



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
        return len(now) == len(copy) and all(map(operator.is_, now, copy))
    if isinstance(copy, dict):
        return now.keys() == copy.keys() and all(now[k] is copy[k] for k in copy)
    return True


@dataclass
class Snapshot:
    """Every module `__dict__` at one moment: keys and values (compared by identity), and copies
    of the items of the watched list/dict values, whose contents the program may change."""

    keys: list[tuple]  # per module dict, its keys
    vals: tuple  # all dicts' values, concatenated in the order of `keys`
    boxes: list[tuple[dict, str, Any, Any]]  # (dict, key, list or dict, copy of its items)

    def per_dict(self) -> list[tuple[tuple, tuple]]:
        """(keys, values) of each module dict."""
        out, i = [], 0
        for keys in self.keys:
            out.append((keys, self.vals[i:i + len(keys)]))
            i += len(keys)
        return out


class DynamicAttributes:
    """The (module, attribute) pairs the program writes, found by watching module `__dict__`s."""

    def __init__(self, root: torch.nn.Module, namespaces: list[dict] = ()):  # type: ignore[assignment]
        self.modules = list(root.modules())
        # module `__dict__`s, then each globals dict of the model's code once
        self._dicts = [m.__dict__ for m in self.modules]
        self._first_global = len(self._dicts)
        self._dicts += list({id(d): d for d in namespaces if all(d is not e for e in self._dicts)}.values())
        self._globals = {id(d) for d in self._dicts[self._first_global:]}
        self._boxes: tuple[tuple, list[tuple[dict, str, Any]]] | None = None  # (all values, watched containers)
        self.slots: list[tuple[dict, str]] = []
        self.original: list[Any] = []  # each slot's value before the program first wrote it

    def _now(self) -> tuple[list[tuple], tuple]:
        return list(map(tuple, self._dicts)), tuple(chain.from_iterable(map(dict.values, self._dicts)))

    def snapshot(self) -> Snapshot:
        # taken around every host statement, so the common case (no module dict changed) runs
        # in C: which values are watched containers is remembered while all values stay the same
        keys, vals = self._now()
        if self._boxes is None or not identical(self._boxes[0], vals):
            self._boxes = (vals, [(d, k, v) for i, d in enumerate(self._dicts) for k, v in d.items()
                                  if type(v) in (list, dict) and self._kept(i, k, v)])
        return Snapshot(keys, vals, [(d, k, v, _copy(v)) for d, k, v in self._boxes[1]])

    def _kept(self, i: int, key: str, value: Any) -> bool:
        """Whether entry `key` of dict i is watched: a public module attribute, a global holding data."""
        return kept(i >= self._first_global, key, value)

    def global_changes(self, changes: list[tuple[dict, str, Any]]) -> list[tuple[dict, str]]:
        """The (namespace, name) of each change that is to a global."""
        return [(d, k) for d, k, _ in changes if id(d) in self._globals]

    def _untouched(self, before: Snapshot) -> bool:
        """No key added, removed or rebound in any module dict since `before` (contents not checked)."""
        keys, vals = self._now()
        return keys == before.keys and identical(vals, before.vals)

    def changed(self, before: Snapshot) -> list[tuple[dict, str, Any]]:
        """(dict, key, value before) of every attribute written since `before`."""
        if self._untouched(before):
            return [(d, k, v) for d, k, v, copy in before.boxes if not _same(v, v, copy)]
        copies = {(id(d), k): copy for d, k, _, copy in before.boxes}
        out: list[tuple[dict, str, Any]] = []
        for i, (d, (keys, vals)) in enumerate(zip(self._dicts, before.per_dict())):
            out += [(d, k, v) for k, v in zip(keys, vals)
                    if self._kept(i, k, v) and not _same(d.get(k), v, copies.get((id(d), k)))]
            known = set(keys)
            out += [(d, k, None) for k, v in d.items() if self._kept(i, k, v) and k not in known]
        return out

    def restore(self, before: Snapshot) -> None:
        if not self._untouched(before):
            for i, (d, (keys, vals)) in enumerate(zip(self._dicts, before.per_dict())):
                known = set(keys)
                for k in [k for k, v in d.items() if self._kept(i, k, v) and k not in known]:
                    del d[k]
                for k, v in zip(keys, vals):
                    if self._kept(i, k, v):
                        d[k] = v
        for _, _, v, copy in before.boxes:
            if isinstance(copy, list):
                v[:] = copy
            else:
                v.clear()
                v.update(copy)

    def register(self, changes: list[tuple[dict, str, Any]]) -> bool:
        """Make the changed attributes slots; True if any is new."""
        known = {(id(d), k) for d, k in self.slots}
        new = []
        for d, k, v in changes:  # (one write may be seen twice: outside and inside torch.export)
            if (id(d), k) not in known:
                known.add((id(d), k))
                new.append((d, k, v))
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
