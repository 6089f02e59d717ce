"""Dicts that keep their key order through a JAX pytree: JAX flattens a dict in sorted key order
and rebuilds it in that order, while torch and Python keep insertion order (and keys that do not
sort at all, `{1: a, "x": b}`, stop JAX's flatten)."""
from __future__ import annotations

from typing import Any

import jax


class InOrder:
    """A dict's keys (in its own order) and values, as one pytree node that rebuilds a plain
    `dict` with the keys in that order."""

    __slots__ = ("keys", "values")

    def __init__(self, keys: tuple, values: list) -> None:
        self.keys, self.values = keys, values


def _flatten(node: InOrder) -> tuple[list, tuple]:
    return node.values, node.keys


def _unflatten(keys: tuple, values: Any) -> dict:
    return dict(zip(keys, values))


jax.tree_util.register_pytree_node(InOrder, _flatten, _unflatten)


def has_dicts(tree: Any) -> bool:
    """Whether a dict lies anywhere in `tree`'s lists, tuples and dicts."""
    t = type(tree)
    if t is dict:
        return True
    if t is list or isinstance(tree, tuple):
        for v in tree:  # (leaves are most of a tree: no call for them, on every dispatch-host call)
            tv = type(v)
            if tv is dict or (tv is list or tv is tuple or isinstance(v, tuple)) and has_dicts(v):
                return True
    return False


def keep_order(tree: Any) -> Any:
    """`tree` with every plain dict (inside lists, tuples, namedtuples and dicts) an `InOrder`
    node, so that flattening and unflattening it gives dicts in their own key order. Trees with
    no dict come back as they are."""
    if not has_dicts(tree):
        return tree
    return _ordered(tree)


def _ordered(tree: Any) -> Any:
    t = type(tree)
    if t is dict:
        return InOrder(tuple(tree), [_ordered(v) for v in tree.values()])
    if t is list:
        return [_ordered(v) for v in tree]
    if t is tuple:
        return tuple(_ordered(v) for v in tree)
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a namedtuple: JAX opens it too
        return t(*[_ordered(v) for v in tree])
    return tree


def leaves_in_order(tree: Any) -> list:
    """`jax.tree_util.tree_leaves(tree)`, a dict's values in its own key order."""
    return jax.tree_util.tree_leaves(keep_order(tree))
