"""A list of same-shaped arrays whose length changes with the input (a decode loop's collected
attention maps) in an exported dispatch host: a part's signatures that differ only in that
length are captured once with the list stacked into one array of symbolic length, which the
statements see as a list `torch.stack` / `torch.cat` take whole, and exported once; the
loaded host (runtime/hosted.py) stacks the list before the call."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import numpy as np
import torch

from dycl_jax.capture.ordered_dicts import keep_order
from dycl_jax.errors import raised_by_us
from dycl_jax.host.dispatch import Compiled, DispatchHost, Part
from dycl_jax.lower.int_ranges import int_scope
from dycl_jax.rewrite.modes import exclusive
from dycl_jax.runtime import hosted_symbolic as symbolic

_JOINS = {torch.stack: "stack", torch.cat: "cat", torch.concat: "cat", torch.concatenate: "cat"}


class StackedList:
    """A list of same-shaped tensors as the statements of a region see it while captured with
    its length symbolic: only `torch.stack(xs, dim)` and `torch.cat(xs, dim)` take it (computed
    from the stacked tensor); any other use fails the capture, and the part stays per length."""

    def __init__(self, stacked: torch.Tensor) -> None:
        self.stacked = stacked

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        how = _JOINS.get(func)
        if how is None or not args or not isinstance(args[0], cls) or len(args) > 2 or set(kwargs) - {"dim"} \
                or any(isinstance(a, cls) for a in (*args[1:], *kwargs.values())):
            raise TypeError(f"a list stacked for export is used by {getattr(func, '__name__', func)}")
        s = args[0].stacked
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        if how == "stack":  # stack(xs, d) of items of rank r: dim 0 of the stack moved to d
            return s.movedim(0, dim % s.dim())
        d = dim % (s.dim() - 1)  # cat(xs, d): the items' dim d, item-major
        return s.movedim(0, d).flatten(d, d + 1)


class _Key:
    """A signature leaf key held as one pytree leaf (keys are tuples themselves)."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key


def _is_array(k: Any) -> bool:
    return isinstance(k, tuple) and len(k) == 2 and isinstance(k[0], tuple)


def _stacked(tree: Any, leaves: tuple) -> tuple[int, Any, tuple, int, int] | None:
    """(position of the only list input of same-shaped arrays, tree and leaf keys with that list
    as one stacked array, its length, its first leaf) for a signature, or None where none is."""
    vals, attrs = jax.tree_util.tree_unflatten(tree, [_Key(k) for k in leaves])
    found = [n for n, v in enumerate(vals) if type(v) is list and v and all(type(x) is _Key and _is_array(x.key)
                                                                            for x in v)
             and len({x.key for x in v}) == 1]
    if len(found) != 1 or attrs is not None:
        return None
    n = found[0]
    shape, dtype = vals[n][0].key
    replaced = list(vals)
    replaced[n] = _Key(((len(vals[n]), *shape), dtype))
    flat, tree2 = jax.tree_util.tree_flatten(keep_order((tuple(replaced), None)))  # as runtime/hosted.py keys it
    return n, tree2, tuple(k.key for k in flat), len(vals[n]), len(jax.tree_util.tree_leaves(vals[:n]))


def groups(part: Part) -> list[tuple[int, list[tuple[Any, tuple, Any, tuple, Compiled]]]]:
    """The part's compiled signatures whose one list input has several lengths, grouped where
    nothing else but sizes differ: (list position, [(tree, keys, stacked tree, stacked keys, program)])."""
    out: dict[Any, list] = {}
    for (tree, leaves, grad, same), entry in symbolic._signatures(part):
        if not isinstance(entry, Compiled) or not grad or same or entry.symbolic:
            continue
        found = _stacked(tree, leaves)
        if found is None:
            continue
        n, tree2, keys2, _, _ = found
        form = (n, str(tree2), tuple((len(k[0]), k[1]) if _is_array(k) else k for k in keys2),
                str(entry.out_tree), tuple(entry.slots), repr(entry.constants), entry.x64)
        out.setdefault(form, []).append((tree, leaves, tree2, keys2, entry))
    return [(form[0], g) for form, g in out.items() if len({len(g2[1]) for g2 in g}) > 1]


def stacked_program(host: DispatchHost, spec: Any, part: Part, fns: list[Callable], n: int, group: list,
                    example: Callable[[Any], Any], state: list, length: int | None = None) -> tuple | str:
    """(plain export, (traced fn, state avals, input avals), ranges, per input its shape with
    symbols, sources, stacked tree, stacked keys, tensor leaves, passed inputs) for a group of `groups`, or why
    not; checked against a compiled signature of the group on random inputs. With `length`, the
    list has that length (torch specialises 1: the symbolic program starts at 2)."""
    tree, leaves, tree2, keys2, entry = max(group, key=lambda g: len(g[1]))  # the longest list: no size 0/1
    varying = symbolic._varying([(g[2], g[3], g[4]) for g in group])
    _, _, _, count, at = _stacked(tree, leaves)  # type: ignore[misc]  (the list's first leaf: the stacked one)
    if length is not None:
        keys2 = keys2[:at] + (((length, *keys2[at][0][1:]), keys2[at][1]),) + keys2[at + 1:]
        varying[at] = [d for d in varying.get(at, []) if d != 0]
    values = [example(k) for k in keys2]
    index = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
    dynamic = [varying.get(i, []) for i in index]
    vals, attrs = jax.tree_util.tree_unflatten(tree2, values)
    inner = host._body(spec, part, fns)

    def body(vals: tuple, attrs: Any) -> Any:
        return inner(tuple(StackedList(v) if k == n else v for k, v in enumerate(vals)), attrs)

    try:
        cap = _capture(host, body, (vals, attrs), dynamic)
    except Exception as exc:  # noqa: BLE001 - a use of the list other than stack/cat: per length instead
        if raised_by_us(exc):
            raise  # our own bug: it must surface, not become a per-signature fallback
        return f"torch.export with the list stacked: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    if list(cap.inputs) != index:
        return "its tensor inputs differ from the stacked list's"
    # outputs that are inputs returned unchanged: their leaf positions once the list is one leaf
    passed = [None if p is None else p if p < at else p - count + 1 if p >= at + count else -1
              for p in entry.passed or [None] * len(entry.slots)]
    if -1 in passed:
        return "it returns an item of the list unchanged"
    expected = dataclasses.replace(entry, passed=passed if any(p is not None for p in passed) else None)
    made = symbolic.export_captured(host, spec, cap, expected, state, [keys2[i][1] for i in index],
                                    static_ok=length is not None)
    if isinstance(made, str):
        return made
    plain, run, graph, ranges, shapes, sources, state_avals, sym_avals = made
    if length is None:
        why = _check(plain, sources, entry, state, leaves, at, count, index)
        if why is not None:
            return why
    traced = functools.partial(run, call=graph.with_margins) if entry.margins is not None else None
    return plain, (traced, state_avals, sym_avals), ranges, shapes, sources, tree2, keys2, index, expected.passed


def _check(plain: Any, sources: list, entry: Compiled, state: list, leaves: tuple,
           offset: int, length: int, index: list[int]) -> str | None:
    """Why the stacked program does not give a compiled signature's outputs on random inputs, if it does not."""
    rng = np.random.default_rng(0)
    arrays = [(rng.standard_normal(k[0]) if np.dtype(k[1]).kind == "f" else rng.integers(0, 3, k[0])).astype(k[1])
              if _is_array(k) else None for k in leaves]
    flat = arrays[:offset] + [np.stack(arrays[offset:offset + length])] + arrays[offset + length:]
    with int_scope(entry.x64):
        want = getattr(entry.fn, "__wrapped__", entry.fn)([state[v] if s else v for s, v in entry.sources],
                                                          [arrays[i] for i in entry.tensor_leaves])
        got = plain.call([state[v] if s else v for s, v in sources], [flat[i] for i in index])
    for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got), strict=True):
        if a.shape != b.shape or a.dtype != b.dtype or not np.allclose(a, b, rtol=1e-5, atol=1e-6):
            return "the stacked program gives other outputs than a compiled signature"
    return None


@exclusive  # torch.export runs under the rewrite's process-wide modes
def _capture(host: DispatchHost, body: Callable, args: tuple, dynamic: list) -> Any:
    from dycl_jax.capture.region import capture_call
    return capture_call(host.root, body, args, host._capture_context, frozenset(), dims=dynamic)
