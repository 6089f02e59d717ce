"""Python values the converted program holds, changed after conversion: the next call is refused.

`if conf > self.threshold:`, `while step < self.max_len`, `if step > cfg.warmup:`, `temperature =
TEMPERATURE`: a converted model reads such Python values once, at conversion (a compiled region,
the staged program, a decision folded to a constant), and the dispatch host reads some of them
again on the host. Setting `model.threshold = 0.9` (or a global, or a config object's field)
afterwards would leave the converted model running with the old value in some places and the new
one in others, with no error. So what the user's code reads and never assigns outside `__init__`
is kept at conversion: plain module attributes and globals (numbers, strings, None, tuples of
them), and the plain fields of dicts and config objects held there (`self.cfg["k"]`,
`cfg.threshold`); each call checks they are the same (`AttributeGuard.check`, well under a
microsecond an entry). Tensors are not checked: the converted model holds its own weights.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import dis
import inspect
import textwrap
import types
import weakref
from typing import Any, Callable

import torch

from dycl_jax.errors import CallError
from dycl_jax.rewrite.attribute_watch import user_functions, user_object

_PLAIN = (bool, int, float, str, type(None))
_MISSING = object()
_MOST_FIELDS = 256  # a dict or object with more plain fields is not watched (a table, not a setting)


def _plain(v: Any) -> bool:
    return type(v) in _PLAIN or type(v) is tuple and all(type(x) in _PLAIN for x in v)


def _same(a: Any, b: Any) -> bool:
    return a is b or type(a) is type(b) and a == b


def _fields(v: Any) -> dict | None:
    """The plain fields of a dict or of a config-like object (`argparse.Namespace`,
    `SimpleNamespace`, a dataclass instance, an instance of a class of the user's), by key; None
    for anything else (a library's object may change its own fields as it works)."""
    if type(v) is dict:
        d = v
    elif type(v) in (argparse.Namespace, types.SimpleNamespace) or dataclasses.is_dataclass(v) and not isinstance(v, type) \
            or user_object(v):
        d = getattr(v, "__dict__", None)
    else:
        return None
    if type(d) is not dict or len(d) > _MOST_FIELDS:
        return None
    plain = {k: x for k, x in d.items() if type(k) is str and _plain(x)}
    return plain or None


class AttributeGuard:
    """Entries (a reader, its name and where it is held for the message, the value at conversion)."""

    def __init__(self, entries: list[tuple[Callable[[], Any], str, str, Any]]):
        self.entries = entries

    def __call__(self) -> None:
        self.check()

    def check(self) -> None:
        for read, name, where, value in self.entries:
            now = read()
            if now is not _GONE and not _same(now, value):
                shown = "deleted" if now is _MISSING else f"{now!r} now"
                raise CallError(
                    f"`{name}` ({where}) is {shown}; it was {value!r} when the model was converted, and the converted model "
                    "holds that value (its programs were built with it)",
                    fix="convert again after changing it: to_jax(model, example_args), or set it back")


_GONE = object()  # the module holding it was freed: nothing can change it


def _attribute(ref: weakref.ref, name: str) -> Callable[[], Any]:
    def read() -> Any:
        owner = ref()
        return _GONE if owner is None else owner.__dict__.get(name, _MISSING)
    return read


def _entry(holder: dict, key: str) -> Callable[[], Any]:
    return lambda: holder.get(key, _MISSING)


def _field_entries(container: Any, name: str, where: str, stores: set[str]) -> list[tuple[Callable[[], Any], str, str, Any]]:
    fields = _fields(container)
    if not fields:
        return []
    d = container if type(container) is dict else container.__dict__
    if user_object(container) and callable(container):
        return []  # a function-like object (a clock, a sampler) changes its own fields as it is called
    return [(_entry(d, k), f"{name}[{k!r}]" if type(container) is dict else f"{name}.{k}", where, v)
            for k, v in fields.items() if k not in stores]


def guard_for(model: torch.nn.Module) -> AttributeGuard | None:
    """The guard of what the user's code reads from the model's modules and the globals (None: nothing)."""
    functions = user_functions([model])
    loads, stores, global_stores = _names(functions)
    entries: list[tuple[Callable[[], Any], str, str, Any]] = []
    watched = loads - stores - {"training"}
    for path, module in model.named_modules():
        ref = weakref.ref(module)
        for name in sorted(watched & module.__dict__.keys()):
            value = module.__dict__[name]
            shown = f"{path}.{name}" if path else name
            if _plain(value):
                entries.append((_attribute(ref, name), shown, "of the torch model", value))
            else:
                entries += _field_entries(value, shown, "of the torch model", stores)
    seen: set[tuple[int, str]] = set()
    for fn in functions:
        g = fn.__globals__
        for name in sorted(_global_loads(fn.__code__) - global_stores):
            if (id(g), name) in seen or name not in g:
                continue
            seen.add((id(g), name))
            value = g[name]
            where = f"a global of {g.get('__name__', '?')}"
            if _plain(value):
                entries.append((_entry(g, name), name, where, value))
            else:
                entries += _field_entries(value, name, where, stores)
    return AttributeGuard(entries) if entries else None


def _global_loads(code: types.CodeType) -> set[str]:
    names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_loads(c)
    return names


def _names(functions: list[types.FunctionType]) -> tuple[set[str], set[str], set[str]]:
    """Attribute names the functions read, those they assign (in any function but `__init__`, or
    by `setattr`, whose name, where computed at run time, may be any: nothing is watched then),
    and the globals they assign (`global n; n = ...`)."""
    loads: set[str] = set()
    stores: set[str] = set()
    global_stores: set[str] = set()
    for fn in functions:
        global_stores |= {i.argval for i in dis.get_instructions(fn.__code__)
                          if i.opname in ("STORE_GLOBAL", "DELETE_GLOBAL")}
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError, SyntaxError):
            continue
        in_init = fn.__name__ == "__init__"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                if isinstance(node.ctx, ast.Load):
                    loads.add(node.attr)
                elif not in_init:
                    stores.add(node.attr)
            elif isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load) and not in_init:
                _changed(node.value, node.slice, stores, global_stores)  # `self.stats["n"] = v`
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not in_init \
                    and node.func.attr in _MUTATORS:
                _changed(node.func.value, None, stores, global_stores)  # `self.cache.update(...)`
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                    and not in_init:
                target = node.args[1] if len(node.args) > 1 else None
                if isinstance(target, ast.Constant) and isinstance(target.value, str):
                    stores.add(target.value)
                else:
                    return set(), set(), set()
    return loads, stores, global_stores


_MUTATORS = frozenset({"update", "setdefault", "pop", "popitem", "clear", "append", "extend", "insert", "remove"})


def _changed(target: ast.expr, key: ast.expr | None, stores: set[str], global_stores: set[str]) -> None:
    """A container the code changes in place: its field `key` where that is a constant string,
    else the whole container (by its attribute or global name)."""
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        stores.add(key.value)
    elif isinstance(target, ast.Attribute):
        stores.add(target.attr)
    elif isinstance(target, ast.Name):
        global_stores.add(target.id)
