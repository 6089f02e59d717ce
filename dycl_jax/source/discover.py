"""Finds the functions a method reaches that may need rewriting: its own code, submodule
methods and helpers, as Python would actually call them on these instances."""
from __future__ import annotations

import dis
import inspect
import os
import sysconfig
import types
from dataclasses import dataclass
from typing import Any

import torch

_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"])
_TORCH = os.path.realpath(os.path.dirname(torch.__file__))
_SELF = os.path.realpath(os.path.dirname(os.path.dirname(__file__)))  # the dycl_jax package
_BRANCH_OPS = {name for name in dis.opname if "JUMP_IF" in name or name.startswith("POP_JUMP")}


@dataclass
class Target:
    """One function to consider, and where Python finds it."""

    fn: types.FunctionType
    owner: Any = None  # object whose attribute `attr` is patched; None for plain helpers
    attr: str | None = None
    binding: str = "function"  # "method" (bound to `bound`), "class" (classmethod), "function"
    bound: Any = None

    @property
    def label(self) -> str:
        if self.owner is None:
            return self.fn.__qualname__
        return f"{type(self.owner).__name__}.{self.attr}"


def is_library(fn: types.FunctionType) -> bool:
    """torch, the standard library and dycl_jax itself are never rewritten."""
    module = getattr(fn, "__module__", "") or ""
    if module == "torch" or module.startswith(("torch.", "dycl_jax.")):
        return True
    path = os.path.realpath(fn.__code__.co_filename)
    if path.startswith((_TORCH + os.sep, _SELF + os.sep)):
        return True
    return path.startswith(_STDLIB + os.sep) and "site-packages" not in path


def has_branching(code: types.CodeType) -> bool:
    """Whether the code (or code nested in it) has a conditional jump: if, while, and/or, ternary."""
    if any(ins.opname in _BRANCH_OPS for ins in dis.get_instructions(code)):
        return True
    return any(has_branching(c) for c in code.co_consts if isinstance(c, types.CodeType))


def code_names(code: types.CodeType) -> set[str]:
    """Global and attribute names the code (and nested code) refers to."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= code_names(c)
    return names


def resolve_attr(owner: Any, attr: str) -> Target | None:
    """What `owner.<attr>(...)` calls, as a Target, or None when it is not a user function."""
    try:
        value = getattr(owner, attr)
    except AttributeError:
        return None
    if isinstance(value, torch.nn.Module) and attr != "forward":
        return None
    if isinstance(value, types.MethodType):
        fn, bound = value.__func__, value.__self__
        binding = "class" if isinstance(bound, type) else "method"
    elif isinstance(value, types.FunctionType):
        fn, bound, binding = value, None, "function"
    else:
        return None
    if not isinstance(fn, types.FunctionType) or is_library(fn):
        return None
    return Target(fn, owner, attr, binding, bound)


def _helpers(fn: types.FunctionType) -> list[types.FunctionType]:
    """User functions `fn` may call by a global or closure name."""
    found = []
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    for name in code_names(fn.__code__) | set(cells):
        if name in cells:
            try:
                value = cells[name].cell_contents
            except ValueError:
                continue
        else:
            value = fn.__globals__.get(name)
        if isinstance(value, types.FunctionType) and not is_library(value) and value.__name__ != "<lambda>":
            found.append(value)
    return found


def discover(model: torch.nn.Module, method: str) -> tuple[list[Target], list[Target]]:
    """(patched targets, plain helper functions) reachable from `model.<method>`.

    Method calls are found through the names the bytecode refers to and the class of every
    submodule; module calls (`self.block(x)`, `for blk in self.blocks: blk(x)`) reach each
    user submodule's forward. Over-approximating is harmless: an unreached method is
    patched with an equivalent rewritten version.
    """
    modules = list(model.modules())  # resolve_attr skips library methods
    queue: list[tuple[Any, str]] = [(model, method)] + [(m, "forward") for m in modules]
    seen_attr: set[tuple[int, str]] = set()
    seen_fn: set[types.FunctionType] = set()
    targets: list[Target] = []
    helpers: list[Target] = []
    names: set[str] = set()
    pending_fns: list[types.FunctionType] = []
    while queue or pending_fns:
        while queue:
            owner, attr = queue.pop(0)
            if (id(owner), attr) in seen_attr:
                continue
            seen_attr.add((id(owner), attr))
            target = resolve_attr(owner, attr)
            if target is None:
                continue
            targets.append(target)
            pending_fns.append(target.fn)
        while pending_fns:
            fn = pending_fns.pop(0)
            if fn in seen_fn:
                continue
            seen_fn.add(fn)
            new_names = code_names(fn.__code__) - names
            names |= new_names
            for m in modules:
                for name in new_names:
                    if isinstance(inspect.getattr_static(type(m), name, None),
                                  (types.FunctionType, staticmethod, classmethod)):
                        queue.append((m, name))
            for helper in _helpers(fn):
                if helper not in seen_fn and all(h.fn is not helper for h in helpers):
                    helpers.append(Target(helper))
                    pending_fns.append(helper)
    return targets, helpers
