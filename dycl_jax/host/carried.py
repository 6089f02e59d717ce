"""Parts of a region that only move arrays (into lists, tuples, outputs) run as Python, not as a capture."""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
import torch

from dycl_jax.capture.ordered_dicts import leaves_in_order
from dycl_jax.errors import raised_by_us
from dycl_jax.host import values
from dycl_jax.rewrite.plan import Undefined


class StandUsed(TypeError):
    """A stand-in's value or type was read: the part does more than move arrays."""


def _from_stand(exc: BaseException | None) -> bool:
    """Whether `exc` is, or was raised while handling, a stand-in's refusal."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, StandUsed):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class Stand:
    """Stands for an array leaf while a part runs as Python: every use of its value (an operator,
    an attribute, its type by isinstance, truth, equality, printing, copying) raises, so a run
    that succeeds only moved it."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    @property
    def __class__(self) -> type:  # type: ignore[override]
        # `isinstance(v, torch.Tensor)` would be False here and True in a capture: it raises instead
        raise StandUsed("an array's type is read here")

    def _used(self, *args: Any, **kwargs: Any) -> Any:
        raise StandUsed("an array's value is read here")

    __eq__ = __ne__ = __bool__ = __len__ = __iter__ = __contains__ = _used  # type: ignore[assignment]
    __repr__ = __str__ = __format__ = __reduce__ = __reduce_ex__ = __copy__ = __deepcopy__ = _used  # type: ignore[assignment]
    __hash__ = object.__hash__  # as a tensor's: by identity


def carry(body: Callable[[tuple, Any], tuple], leaves: list, tree: Any) -> tuple:
    """Run a part whose statements only move its array leaves: as Python on fresh containers
    holding stand-ins, then with the arrays put back (the result is new containers, as a compiled
    program's is, so in-place and identity handling apply alike)."""
    stands = [Stand(i) if isinstance(v, values.ARRAYS) else v for i, v in enumerate(leaves)]
    vals, attrs = jax.tree_util.tree_unflatten(tree, stands)
    return _back(body(vals, attrs), leaves)


def _back(v: Any, leaves: list) -> Any:
    """`v` with each stand-in replaced by its array, through lists, tuples and dicts (by exact
    type: `isinstance` would ask a stand-in its class); other objects are left as they are, and
    `only_moves` refuses them."""
    t = type(v)
    if t is Stand:
        return leaves[v.index]
    if t is list:
        return [_back(x, leaves) for x in v]
    if t is tuple:
        return tuple(_back(x, leaves) for x in v)
    if t is dict:
        return {k: _back(x, leaves) for k, x in v.items()}
    if issubclass(t, tuple) and hasattr(t, "_fields"):  # a namedtuple
        return t(*(_back(x, leaves) for x in v))
    return v


def only_moves(body: Callable[[tuple, Any], tuple], leaves: list, tree: Any) -> bool:
    """Whether the part, run once as Python with stand-ins for its array leaves, neither reads an
    array's value nor makes a tensor (the caller restores module attributes and checks they did
    not change). Only arrays, immutable Python values and modules may go in and come out. Any exception means no: the part is captured as usual, and raises there if the
    user's code does."""
    if not all(map(_plain, leaves)):  # an object of the user's could keep a stand-in (`state.h = h`)
        return False
    try:
        outs = carry(body, leaves, tree)
    except Exception as exc:  # noqa: BLE001  (a stand-in was used, or the statement fails: capture decides)
        if raised_by_us(exc) and not _from_stand(exc):  # a stand-in's refusal is raised here, and is no bug
            raise
        return False
    return all(map(_plain, leaves_in_order(outs)))  # no tensor made, no stand-in kept inside an object


def _plain(v: Any) -> bool:
    """An array, an immutable Python value or a module: what a carried part may take and give."""
    t = type(v)
    return t in values.PLAIN or t is Undefined or issubclass(t, (*values.ARRAYS, np.generic, torch.nn.Module))
