"""Module attributes that carry state from one call to the next (a counter read back, a hidden
state kept on `self` for the next call): found by calling the torch model twice on the example,
and refused with the attribute's file:line, since a converted model starts every call from the
attributes' values at conversion."""
from __future__ import annotations

import ast
import collections.abc
import contextlib
import copy
import inspect
import io
import os
import textwrap
import types
import warnings
from typing import Any

import torch
import torch.utils._pytree as pytree

from dycl_jax.capture import state_updates
from dycl_jax.errors import DyclError, Location, limitation
from dycl_jax.rewrite.attribute_watch import kept, namespaces, user_file, user_object
from dycl_jax.rewrite.converters.attribute_stores import targets

# per holder: the holder, its attributes, and the contents of those that are containers or iterators
# (a list's or dict's items, an iterator's position)
Snapshot = list[tuple[Any, dict[str, Any], dict[str, Any]]]


def check_no_carried_state(model: torch.nn.Module, args: tuple, method: str) -> None:
    """Refuse a model whose `method` changes a module attribute on every call in a way its
    results see: the second of two calls on the example changes an attribute again and returns
    something else. (A cache filled on the first call, or a counter no output reads, passes.) The
    model's attributes are as before when this returns."""
    fn = getattr(model, method, None)
    if not callable(fn):
        return  # the conversion reports a missing method itself
    holders = _holders(model)
    before = _snapshot(model, holders)
    tensors = state_updates.save(model)
    modes = [(m, m.training) for m in model.modules()]  # (a submodule may have a mode of its own)
    model.eval()  # as the conversion runs it
    try:
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                first = fn(*_fresh(args))
            except Exception:  # noqa: BLE001  (the conversion itself reports a model that fails on its example)
                return
            moved_tensors = state_updates.updated(tensors)
            if moved_tensors:
                raise state_updates.refusal(moved_tensors, state_updates.locate(fn, _fresh(args), tensors))
            settled = _snapshot(model, holders)
            if not _changed(before, settled):
                return
            try:
                second, failure = fn(*_fresh(args)), None
            except Exception as exc:  # noqa: BLE001  (the state the first call left made it fail)
                second, failure = None, exc
            moved = _changed(settled, _snapshot(model, holders))
            if moved and (failure is not None or not _equal(first, second)):
                raise _refusal(moved, failure)
    finally:
        _restore(before)
        state_updates.restore(tensors)  # the conversion leaves the model's tensors as they were
        for m, training in modes:
            m.training = training


def _fresh(args: tuple) -> tuple:
    """Copies of the tensors: a method that updates its inputs in place leaves the caller's alone."""
    return pytree.tree_map_only(torch.Tensor, lambda t: t.clone(), args)


class _Globals:
    """A module's globals as the attributes of an object, so the snapshot code reads them as it
    reads a module's (`vars()`): `COUNTS["n"] += 1` or `_DRIFT[0] += 1.0` in a forward is state kept
    from one call to the next as an attribute is."""

    def __init__(self, namespace: dict) -> None:
        self.__dict__ = namespace  # (no attribute of its own: it would be a global of the user's module)


class _Cells:
    """A closure's free variables as the attributes of an object (name -> value), so the snapshot
    reads and puts back its cells as it does a module's attributes: `TICK = make_counter()`, whose
    `nonlocal n` the forward bumps on every call, keeps state as an attribute does."""

    __slots__ = ("fn", "held_as", "cells")  # (its `__dict__` is the cells' values, below)

    def __init__(self, fn: types.FunctionType, held_as: str) -> None:
        self.fn = fn
        self.held_as = held_as  # the global or attribute that holds the function (for the refusal)
        self.cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))

    @property
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]  (what vars() reads)
        out = {}
        for n, cell in self.cells.items():
            try:
                out[n] = cell.cell_contents
            except ValueError:  # a cell not filled yet
                continue
        return out


def _holders(model: torch.nn.Module) -> list[Any]:
    """The model's modules, then the globals of every user class's methods (once each), then the
    objects of the user's own classes those hold (a ticker or meter whose method bumps its field
    as the forward calls it: `stamp = TICK()`), then the closures of the user's functions any of
    them holds (`TICK = make_counter()`)."""
    holders: list[Any] = [*model.modules(), *(_Globals(g) for g in namespaces([model]))]
    seen = {id(h) for h in holders}
    for h in list(holders):
        for v in list(vars(h).values()):
            if id(v) not in seen and user_object(v):
                seen.add(id(v))
                holders.append(v)
    for h in list(holders):
        for k, v in list(vars(h).items()):
            if isinstance(v, types.FunctionType) and v.__closure__ and id(v) not in seen \
                    and user_file(v.__code__.co_filename):
                seen.add(id(v))
                holders.append(_Cells(v, k if isinstance(h, _Globals) else f"self.{k}"))
    return holders


def _global_like(m: Any) -> bool:
    """Whether a holder's entries are read as a module's globals are (data only, any name)."""
    return isinstance(m, (_Globals, _Cells))


def _position(v: Any) -> Any:
    """Where an iterator stands, as a comparable value (`itertools.count(5)` after one `next`:
    its reduce state; a generator: its frame's place and locals), else None. A global iterator
    the forward advances (`k = next(COUNT)`) keeps state from one call to the next."""
    if not isinstance(v, collections.abc.Iterator):
        return None
    if isinstance(v, types.GeneratorType):
        frame = v.gi_frame
        return ("generator", None if frame is None else (frame.f_lasti, dict(frame.f_locals)))
    try:
        return ("reduced", v.__reduce__())
    except Exception:  # noqa: BLE001  (an iterator without reduce state: its position is unknown)
        return None


def _snapshot(model: torch.nn.Module, holders: list[Any] | None = None) -> Snapshot:
    out: Snapshot = []
    for m in holders if holders is not None else model.modules():
        attrs = {k: v for k, v in vars(m).items() if kept(_global_like(m), k, v)}
        items = {k: (list(v) if isinstance(v, list) else dict(v)) for k, v in attrs.items() if isinstance(v, (list, dict))}
        for k, v in attrs.items():
            at = _position(v)
            if at is not None:
                items[k] = (at, _copied(v))
        out.append((m, attrs, items))
    return out


def _copied(it: Any) -> Any:
    """An iterator at `it`'s position that does not move with it (None for a generator, which
    cannot be copied): put back in its place after the check's calls advanced the original."""
    if isinstance(it, types.GeneratorType):
        return None
    try:
        return copy.copy(it)
    except Exception:  # noqa: BLE001
        return None


def _restore(snap: Snapshot) -> None:
    for m, attrs, items in snap:
        if isinstance(m, _Cells):
            for k, v in attrs.items():
                _put(m, k, v)
        else:
            made = [k for k, v in vars(m).items() if k not in attrs and kept(_global_like(m), k, v)]
            for k in made:  # made by the calls
                del m.__dict__[k]
            m.__dict__.update(attrs)
        for k, held in items.items():
            box = attrs[k]
            if isinstance(box, list):
                box[:] = held
            elif isinstance(box, dict):
                box.clear()
                box.update(held)
            elif held[1] is not None and _position(box) != held[0]:  # an iterator the calls advanced
                _put(m, k, held[1])


def _put(m: Any, k: str, v: Any) -> None:
    if isinstance(m, _Cells):
        m.cells[k].cell_contents = v
    else:
        m.__dict__[k] = v


def _changed(a: Snapshot, b: Snapshot) -> list[tuple[torch.nn.Module, str]]:
    """(module, attribute) of each attribute that differs between two snapshots."""
    out = []
    for (m, attrs, items), (_, now, now_items) in zip(a, b):
        for k in attrs.keys() | now.keys():
            if k not in attrs or k not in now or not _same(attrs[k], now[k]) \
                    or (k in items and not _same_items(items[k], now_items.get(k))):
                out.append((m, k))
    return out


def _same(x: Any, y: Any) -> bool:
    if x is y:
        return True
    try:
        return type(x) is type(y) and not isinstance(x, torch.Tensor) and bool(x == y)
    except Exception:  # noqa: BLE001  (no equality of its own: a new object is a change)
        return False


def _same_items(x: Any, y: Any) -> bool:
    if isinstance(x, tuple):  # an iterator's (position, copy)
        return isinstance(y, tuple) and _same(x[0], y[0])
    if isinstance(x, list):
        return isinstance(y, list) and len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y))
    return isinstance(y, dict) and x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)


def _equal(a: Any, b: Any) -> bool:
    """The two calls' results are the same, exactly (NaN equal to NaN)."""
    la, sa = pytree.tree_flatten(a)
    lb, sb = pytree.tree_flatten(b)
    return sa == sb and all(_same_tensor(x, y) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
                            else not isinstance(x, torch.Tensor) and _same(x, y) for x, y in zip(la, lb))


def _same_tensor(x: torch.Tensor, y: torch.Tensor) -> bool:
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    if x.is_floating_point():
        nan = x.isnan()
        return torch.equal(nan, y.isnan()) and torch.equal(x.masked_fill(nan, 0), y.masked_fill(nan, 0))
    return torch.equal(x, y)


def _refusal(moved: list[tuple[Any, str]], failure: Exception | None) -> DyclError:
    names = [k if _global_like(m) else f"self.{k}" for m, k in moved]
    m, k = moved[0]
    if isinstance(m, _Cells):
        where = _cell_written_at(m.fn, k)
        owner = f"kept by the closure `{m.held_as}`, {m.fn.__qualname__}"
    else:
        where = _global_written_at(vars(m), k) if isinstance(m, _Globals) else _written_at(type(m), k)
        owner = f"a global of {os.path.basename(str(vars(m).get('__file__', '?')))}" if isinstance(m, _Globals) \
            else type(m).__name__ if isinstance(m, torch.nn.Module) else f"a {type(m).__name__} object the model uses"
    seen = (f"a second call on the example raised {type(failure).__name__}" if failure is not None
            else "a second call on the example returns a different result")
    return DyclError(
        f"`{names[0]}` ({owner}) carries state from one call to the next"
        + (f" (so do {', '.join(f'`{n}`' for n in names[1:4])})" if len(names) > 1 else "")
        + f": each call changes it again and {seen}; a converted model starts every call from the "
        "module attributes and globals as they were at conversion, so every call after the first would differ "
        "from torch", location=where,
        fix=limitation(f"state kept across calls (`{names[0]}`)", "dycl_jax/capture/carried_state.py"))


def _written_at(cls: type, attr: str) -> Location | None:
    """The first assignment to `self.<attr>` in the class's own methods (forward first)."""
    try:
        lines, start = inspect.getsourcelines(cls)
        file = inspect.getsourcefile(cls)
    except (OSError, TypeError):
        return None
    tree = ast.parse(textwrap.dedent("".join(lines)))
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef) or fn.name == "__init__":
            continue
        for node in ast.walk(fn):
            if any(isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name)
                   and t.value.id == "self" for t in targets(node)):
                found.append((fn.name != "forward", node.lineno))
    if not found or file is None:
        return None
    line = start + min(found)[1] - 1
    return Location(file, line, lines[line - start].strip())


def _cell_written_at(fn: types.FunctionType, name: str) -> Location | None:
    """The first statement of the closure's function that changes its free variable `name`."""
    try:
        lines, start = inspect.getsourcelines(fn)
        file = inspect.getsourcefile(fn)
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return None
    node = _first_change(tree, name)
    if node is None or file is None:
        return None
    return Location(file, start + node.lineno - 1, lines[node.lineno - 1].strip())


def _global_written_at(namespace: dict, name: str) -> Location | None:
    """The first statement inside a function of the global's module that changes it: assigns it
    (`global`), stores into it (`_DRIFT[0] += 1.0`) or calls a method on it (`SEEN.append(t)`)."""
    file = namespace.get("__file__")
    try:
        with open(file, encoding="utf-8") as f:  # type: ignore[arg-type]
            text = f.read()
        tree = ast.parse(text)
    except (OSError, TypeError, SyntaxError, ValueError):
        return None
    lines = text.splitlines()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and (node := _first_change(fn, name)) is not None:
            return Location(file, node.lineno, lines[node.lineno - 1].strip())  # type: ignore[arg-type]
    return None


def _first_change(tree: ast.AST, name: str) -> ast.stmt | None:
    """The first statement in `tree` that changes `name` (`_touches`)."""
    return next((node for node in ast.walk(tree)
                 if isinstance(node, (ast.Assign, ast.AugAssign, ast.Expr)) and _touches(node, name)), None)


def _touches(node: ast.stmt, name: str) -> bool:
    for t in targets(node):
        root = t
        while isinstance(root, (ast.Subscript, ast.Attribute)):
            root = root.value
        if isinstance(root, ast.Name) and root.id == name:
            return True
    if any(isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "next" and c.args
           and isinstance(c.args[0], ast.Name) and c.args[0].id == name for c in ast.walk(node)):
        return True  # `k = next(COUNT)` advances the iterator
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute):
        root = node.value.func.value
        return isinstance(root, ast.Name) and root.id == name
    return False
