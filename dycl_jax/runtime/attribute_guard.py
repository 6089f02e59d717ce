"""Module attributes the converted program holds as values: a call after one changed is refused.

`if conf > self.threshold:`, `while step < self.max_len`, `time.perf_counter() - start >
self.budget`: a converted model reads such Python values once, at conversion (a compiled region,
the staged program, a decision folded to a constant), and the dispatch host reads some of them
again on the host. Setting `model.threshold = 0.9` afterwards would leave the converted model
running with the old value in some places and the new one in others, with no error. So the
values of the plain attributes (numbers, strings, None, tuples of them) that the user's code
reads and never assigns outside `__init__` are kept at conversion, and each call checks that
they are the same (`AttributeGuard.check`, about 0.2 µs an attribute).
"""
from __future__ import annotations

import ast
import inspect
import textwrap
import weakref
from typing import Any

import torch

from dycl_jax.errors import CallError
from dycl_jax.rewrite.attribute_watch import user_functions

_PLAIN = (bool, int, float, str, type(None))
_MISSING = object()


def _plain(v: Any) -> bool:
    return type(v) in _PLAIN or type(v) is tuple and all(type(x) in _PLAIN for x in v)


class AttributeGuard:
    """The watched (module, attribute, value at conversion) entries, checked on every call."""

    def __init__(self, entries: list[tuple[weakref.ref, str, str, Any]]):
        self.entries = entries  # (the module, its path in the model, the attribute, the value)

    def __call__(self) -> None:
        self.check()

    def check(self) -> None:
        for ref, path, name, value in self.entries:
            module = ref()
            if module is None:  # the torch model is gone: nothing can change it
                continue
            now = module.__dict__.get(name, _MISSING)
            if now is not value and not (type(now) is type(value) and now == value):
                where = f"{path}.{name}" if path else name
                shown = "deleted" if now is _MISSING else f"{now!r} now"
                raise CallError(
                    f"`{where}` of the torch model is {shown}; it was {value!r} when the model was converted, and "
                    "the converted model holds that value (its programs were built with it)",
                    fix="convert again after changing it: to_jax(model, example_args), or set it back")


def guard_for(model: torch.nn.Module) -> AttributeGuard | None:
    """The guard of the plain attributes the user's code reads from the model's modules (None: none)."""
    loads, stores = _attribute_names(model)
    watched = loads - stores - {"training"}
    entries = []
    for path, module in model.named_modules():
        for name in sorted(watched & module.__dict__.keys()):
            value = module.__dict__[name]
            if _plain(value):
                entries.append((weakref.ref(module), path, name, value))
    return AttributeGuard(entries) if entries else None


def _attribute_names(model: torch.nn.Module) -> tuple[set[str], set[str]]:
    """Attribute names the user's functions the model runs read, and those they assign (in any
    method but `__init__`, or by `setattr`, which assigns a name not known here: all of them then)."""
    loads: set[str] = set()
    stores: set[str] = set()
    for fn in user_functions([model]):
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
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                    and not in_init:
                target = node.args[1] if len(node.args) > 1 else None
                if isinstance(target, ast.Constant) and isinstance(target.value, str):
                    stores.add(target.value)
                else:
                    return set(), set()  # a name computed at run time: any attribute may change
    return loads, stores
