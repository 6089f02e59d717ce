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


def _watched(key: str) -> bool:
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
    names: dict[int, str]  # id(module dict) -> the module's name in the model
    items: list[tuple[dict, dict[str, Any], dict[str, Any]]]  # (module dict, watched items, their contents)


def snapshot(roots: list[torch.nn.Module]) -> Snapshot:
    names: dict[int, str] = {}
    items = []
    for root in roots:
        for path, m in root.named_modules():
            d = m.__dict__
            if id(d) in names:
                continue
            names[id(d)] = path or type(m).__name__
            kept = {k: v for k, v in d.items() if _watched(k)}
            items.append((d, kept, {k: c for k, v in kept.items() if (c := _contents(v)) is not None}))
    return Snapshot(names, items)


def changed(before: Snapshot) -> list[str]:
    """`module.attr` for every watched attribute added, removed, rebound or changed in content."""
    out = []
    for d, kept, contents in before.items:
        prefix = before.names[id(d)]
        now = {k for k in d if _watched(k)}
        for k in sorted(now | set(kept)):
            if k not in d or k not in kept or d[k] is not kept[k] \
                    or k in contents and not _same_contents(d[k], contents[k]):
                out.append(f"{prefix}.{k}")
    return out


def restore(before: Snapshot) -> None:
    for d, kept, contents in before.items:
        for k in [k for k in d if _watched(k) and k not in kept]:
            del d[k]
        for k, v in kept.items():
            d[k] = v
            if k in contents:
                c = contents[k]
                if isinstance(v, list):
                    v[:] = c
                elif isinstance(v, dict):
                    v.clear()
                    v.update(c)
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
