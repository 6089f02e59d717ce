"""Refuses a staged branch or loop body whose trace changed a module attribute.

A traced path runs each statement once, whatever the data decides, so a module attribute it
changes (`self.count += 1` in a helper the branch calls, `self.hist.append(t)`, `setattr`) would
keep that one traced value. converters/attribute_stores.py refuses the statements it can see in
the rewritten code, at their line; this watch catches the rest (code that is not rewritten, a
helper method with no branch of its own) by comparing the model's module attributes before and
after each trace, and puts them back before refusing."""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch

from dycl_jax.errors import DyclError
from dycl_jax.rewrite.sites import Site


def watched(key: str) -> bool:
    """A module attribute a program may change (not private; `training` is the hosts' own)."""
    return not key.startswith("_") and key != "training"


def _contents(v: Any) -> Any:
    """A copy of a list/dict/set's items (compared by identity after), else None."""
    if isinstance(v, list):
        return list(v)
    if isinstance(v, dict):
        return list(v.items())
    if isinstance(v, set):
        return set(map(id, v))
    return None


def _same_contents(v: Any, copy: Any) -> bool:
    if isinstance(v, list):
        return len(v) == len(copy) and all(map(operator.is_, v, copy))
    if isinstance(v, dict):
        items = list(v.items())
        return len(items) == len(copy) and all(a[0] == b[0] and a[1] is b[1] for a, b in zip(items, copy))
    if isinstance(v, set):
        return set(map(id, v)) == copy
    return True


@dataclass
class Snapshot:
    names: list[str]  # per module dict: the module's name in the model
    dicts: list[dict]  # each module's `__dict__`, once
    keys: list[tuple]  # per dict: its keys then
    vals: list[tuple]  # per dict: its values then (compared by identity)
    boxes: list[tuple[int, str, Any, Any]]  # (dict index, key, watched list/dict/set, copy of its items)


# per module dict: (the dict, its values when last seen, its watched containers then): a trace
# changes no attribute in the usual case, so the containers are found again only where a value changed
_CONTAINERS: dict[int, tuple[dict, tuple, list[tuple[str, Any]]]] = {}


def forget() -> None:
    """Drop the cache (a capture is over: it must not keep the model's dicts, or their tensors, alive)."""
    _CONTAINERS.clear()


def identical(a: tuple, b: tuple) -> bool:
    """Same length and the same objects, compared in C."""
    return len(a) == len(b) and all(map(operator.is_, a, b))


def _containers(d: dict, vals: tuple) -> list[tuple[str, Any]]:
    cached = _CONTAINERS.get(id(d))
    if cached is not None and cached[0] is d and identical(cached[1], vals):
        return cached[2]
    found = [(k, v) for k, v in d.items() if type(v) in (list, dict, set) and watched(k)]
    _CONTAINERS[id(d)] = (d, vals, found)
    return found


def snapshot(roots: list[torch.nn.Module]) -> Snapshot:
    names: list[str] = []
    dicts: list[dict] = []
    seen: set[int] = set()
    for root in roots:
        for path, m in root.named_modules():
            d = m.__dict__
            if id(d) not in seen:
                seen.add(id(d))
                names.append(path or type(m).__name__)
                dicts.append(d)
    keys = [tuple(d) for d in dicts]
    vals = [tuple(d.values()) for d in dicts]
    boxes = [(i, k, v, _contents(v)) for i, d in enumerate(dicts) for k, v in _containers(d, vals[i])]
    return Snapshot(names, dicts, keys, vals, boxes)


def changed(before: Snapshot) -> list[str]:
    """`module.attr` for every watched attribute added, removed, rebound or changed in content."""
    out: set[tuple[int, str]] = set()
    for i, d in enumerate(before.dicts):
        if tuple(d) == before.keys[i] and identical(tuple(d.values()), before.vals[i]):
            continue
        then = dict(zip(before.keys[i], before.vals[i]))
        for k in {k for k in d if watched(k)} | {k for k in then if watched(k)}:
            if k not in d or k not in then or d[k] is not then[k]:
                out.add((i, k))
    for i, k, v, copy in before.boxes:
        if before.dicts[i].get(k) is v and not _same_contents(v, copy):
            out.add((i, k))
    return [f"{before.names[i]}.{k}" for i, k in sorted(out)]


def restore(before: Snapshot) -> None:
    for i, d in enumerate(before.dicts):
        if tuple(d) == before.keys[i] and identical(tuple(d.values()), before.vals[i]):
            continue
        then = dict(zip(before.keys[i], before.vals[i]))
        for k in [k for k in d if watched(k) and k not in then]:
            del d[k]
        for k, v in then.items():
            if watched(k):
                d[k] = v
    for _, _, v, copy in before.boxes:
        if isinstance(v, list):
            v[:] = copy
        elif isinstance(v, dict):
            v.clear()
            v.update(copy)
        # (a set's former items are not kept: refused all the same)


def refuse_changes(before: Snapshot, site: Site) -> None:
    """Raise (after putting the attributes back) where a trace changed one."""
    found = changed(before)
    if not found:
        return
    restore(before)
    raise DyclError(
        f"{site.construct}: while it was staged, module attribute `{found[0]}` changed"
        + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")
        + ": a staged path runs each statement once, when it is traced, so the attribute would keep the "
          "traced value whatever the data decides", location=site.location,
        fix='convert with host="auto" (the default) or host="dispatch": that host runs this construct in Python')
