"""Refuses a staged branch or loop body whose trace changed a module attribute or a global.

A traced path runs each statement once, whatever the data decides, so a module attribute it
changes (`self.count += 1` in a helper the branch calls, `self.hist.append(t)`, `setattr`) or a
global holding data (`COUNTS["n"] += 1` in a helper function) would keep that one traced value.
converters/attribute_stores.py refuses the statements it can see in the rewritten code, at their
line; this watch catches the rest (code that is not rewritten, a helper with no branch of its own)
by comparing the model's module attributes, and the data globals of the user's modules the
model's code runs (`namespaces`), before and after each trace, and puts them back before refusing."""
from __future__ import annotations

import operator
import os
import sys
import types
from dataclasses import dataclass
from typing import Any

import torch

from dycl_jax.errors import DyclError
from dycl_jax.source.discover import code_names
from dycl_jax.rewrite.sites import Site


def watched(key: str) -> bool:
    """A module attribute a program may change (not private; `training` is the hosts' own)."""
    return not key.startswith("_") and key != "training"


def global_data(key: str, value: Any) -> bool:
    """A global that holds data (not a module, class, function or other callable; not a dunder)."""
    return not key.startswith("__") and not isinstance(value, (types.ModuleType, type)) and not callable(value)


def namespaces(roots: list[torch.nn.Module]) -> list[dict]:
    """The globals of the modules that the roots' classes run: where each method is defined (any
    class but torch's own), and, transitively, where the functions, classes and modules those
    methods name are (a helper `ph.bump(h)` from another file bumps a counter there), library
    code (site-packages, the standard library, this package) left out of that walk; once each."""
    return _user_code(roots)[1]


def user_functions(roots: list[torch.nn.Module]) -> list[types.FunctionType]:
    """The user's functions those classes run (their methods first, then what they name), as `namespaces` walks them."""
    return _user_code(roots)[0]


_SPACES: dict[frozenset, tuple[list, list[dict]]] = {}  # per set of classes (a conversion asks once per trace)
_LIBRARY = tuple({os.path.dirname(os.__file__), os.path.dirname(os.path.dirname(__file__)),
                  *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))})
_MOST_FUNCTIONS = 2000  # a bound on the walk through a large code base


def _user_code(roots: list[torch.nn.Module]) -> tuple[list, list[dict]]:
    classes = frozenset(type(m) for root in roots for m in root.modules())
    found = _SPACES.get(classes)
    if found is None:
        found = _SPACES[classes] = _walk(classes)
    return found


def user_space(namespace: dict) -> bool:
    """Whether a module's globals are the user's (not the standard library, site-packages or this package)."""
    file = namespace.get("__file__")
    if not isinstance(file, str):
        return namespace.get("__name__") == "__main__"  # a notebook's or an interactive session's code
    return user_file(file)


def user_object(v: Any) -> bool:
    """An instance of a class defined in the user's code, with fields of its own (not a module,
    tensor, function or class): a settings object, a ticker or meter."""
    cls = type(v)
    if issubclass(cls, (torch.nn.Module, torch.Tensor, type, types.ModuleType, types.FunctionType, types.MethodType)) \
            or not isinstance(getattr(v, "__dict__", None), dict):
        return False
    module = sys.modules.get(cls.__module__)
    return module is not None and user_space(vars(module))


def user_file(file: str) -> bool:
    """Whether a code file is the user's: generated code (the rewrite's, a notebook cell's) counts,
    the standard library's frozen modules do not."""
    if file.startswith("<"):
        return not file.startswith("<frozen")
    return not os.path.abspath(file).startswith(_LIBRARY)


def _functions_of(cls: type) -> list[types.FunctionType]:
    out = []
    for v in vars(cls).values():
        v = getattr(v, "__func__", getattr(v, "fget", v))  # staticmethod, classmethod, property
        if isinstance(v, types.FunctionType):
            out.append(v)
    return out


def _walk(classes: frozenset) -> tuple[list[types.FunctionType], list[dict]]:
    spaces: dict[int, dict] = {}
    functions: list[types.FunctionType] = []
    todo = [f for cls in sorted(classes, key=lambda c: c.__qualname__) if not cls.__module__.startswith("torch.")
            for f in _functions_of(cls)][::-1]  # popped from the end: the classes' methods first, in order
    methods = {id(f) for f in todo}  # (the model's own classes count wherever they are installed)
    seen: set[int] = set()
    while todo and len(seen) < _MOST_FUNCTIONS:
        fn = todo.pop()
        if id(fn) in seen or id(fn) not in methods and not user_space(fn.__globals__):
            continue
        seen.add(id(fn))
        functions.append(fn)
        g = fn.__globals__
        spaces.setdefault(id(g), g)
        names = code_names(fn.__code__)
        for name in sorted(names):
            v = g.get(name)
            if isinstance(v, types.FunctionType):
                todo.insert(0, v)
            elif isinstance(v, type) and v not in classes:
                todo[:0] = _functions_of(v)
            elif isinstance(v, types.ModuleType) and user_space(vars(v)):
                spaces.setdefault(id(vars(v)), vars(v))
                todo[:0] = [w for w in (vars(v).get(n) for n in sorted(names)) if isinstance(w, types.FunctionType)]
    return functions, list(spaces.values())


def kept(is_global: bool, key: str, value: Any) -> bool:
    """Whether a dict entry is watched: a module's public attribute, or a global holding data."""
    return global_data(key, value) if is_global else watched(key)


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
    names: list[str]  # per dict: the module's name in the model, or the file whose globals it holds
    dicts: list[dict]  # each module's `__dict__`, once, then the namespaces of `namespaces()`
    globals_from: int  # dicts from this index on are namespaces
    keys: list[tuple]  # per dict: its keys then
    vals: list[tuple]  # per dict: its values then (compared by identity)
    boxes: list[tuple[int, str, Any, Any]]  # (dict index, key, watched list/dict/set, copy of its items)


# per module dict: (the dict, its values when last seen, its watched containers then): a trace
# changes no attribute in the usual case, so the containers are found again only where a value changed
_CONTAINERS: dict[int, tuple[dict, tuple, list[tuple[str, Any]]]] = {}


def forget() -> None:
    """Drop the cache (a capture is over: it must not keep the model's dicts, or their tensors, alive)."""
    _CONTAINERS.clear()
    _SPACES.clear()


def identical(a: tuple, b: tuple) -> bool:
    """Same length and the same objects, compared in C."""
    return len(a) == len(b) and all(map(operator.is_, a, b))


def _containers(d: dict, vals: tuple, is_global: bool) -> list[tuple[str, Any]]:
    cached = _CONTAINERS.get(id(d))
    if cached is not None and cached[0] is d and identical(cached[1], vals):
        return cached[2]
    found = [(k, v) for k, v in d.items() if type(v) in (list, dict, set) and kept(is_global, k, v)]
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
    globals_from = len(dicts)
    for g in namespaces(roots):
        names.append(os.path.basename(str(g.get("__file__", g.get("__name__", "?")))))
        dicts.append(g)
    keys = [tuple(d) for d in dicts]
    vals = [tuple(d.values()) for d in dicts]
    boxes = [(i, k, v, _contents(v)) for i, d in enumerate(dicts)
             for k, v in _containers(d, vals[i], i >= globals_from)]
    return Snapshot(names, dicts, globals_from, keys, vals, boxes)


def changed(before: Snapshot) -> list[str]:
    """"module attribute `module.attr`" or "global `name` of file.py" for every watched entry
    added, removed, rebound or changed in content."""
    out: set[tuple[int, str]] = set()
    for i, d in enumerate(before.dicts):
        if tuple(d) == before.keys[i] and identical(tuple(d.values()), before.vals[i]):
            continue
        then = dict(zip(before.keys[i], before.vals[i]))
        is_global = i >= before.globals_from
        for k in {k for k, v in d.items() if kept(is_global, k, v)} | \
                {k for k, v in then.items() if kept(is_global, k, v)}:
            if k not in d or k not in then or d[k] is not then[k]:
                out.add((i, k))
    for i, k, v, copy in before.boxes:
        if before.dicts[i].get(k) is v and not _same_contents(v, copy):
            out.add((i, k))
    return [f"global `{k}` of {before.names[i]}" if i >= before.globals_from
            else f"module attribute `{before.names[i]}.{k}`" for i, k in sorted(out)]


def restore(before: Snapshot) -> None:
    for i, d in enumerate(before.dicts):
        if tuple(d) == before.keys[i] and identical(tuple(d.values()), before.vals[i]):
            continue
        then = dict(zip(before.keys[i], before.vals[i]))
        is_global = i >= before.globals_from
        for k in [k for k, v in d.items() if kept(is_global, k, v) and k not in then]:
            del d[k]
        for k, v in then.items():
            if kept(is_global, k, v):
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
    if all(f.startswith("global") for f in found):
        fix = ("keep the value in a local variable or a module attribute (`self.n`) instead of a global: "
               "the dispatch host carries module attributes, and host=\"auto\" (the default) moves this "
               "construct to it")
    else:
        fix = 'convert with host="auto" (the default) or host="dispatch": that host runs this construct in Python'
    raise DyclError(
        f"{site.construct}: while it was staged, {found[0]} changed"
        + (f" (and {len(found) - 1} more)" if len(found) > 1 else "")
        + ": a staged path runs each statement once, when it is traced, so it would keep the "
          "traced value whatever the data decides", location=site.location, fix=fix)
