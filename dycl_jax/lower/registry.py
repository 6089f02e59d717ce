"""The one table from ATen overloads (and a few Python operators) to their JAX lowerings."""
from __future__ import annotations

import math
import operator
from typing import Any, Callable

import torch

from dycl_jax.errors import Location, RegistryError, UnsupportedOpError

LoweringFn = Callable[..., Any]
_TABLE: dict[Any, LoweringFn] = {}

# Python-level targets that appear in exported graphs besides ATen overloads: getitem on
# multi-output ops and SymInt arithmetic for dynamic shapes.
_PY_TARGETS = {getattr(operator, n) for n in dir(operator) if not n.startswith("_")} | {
    getattr(torch, n) for n in dir(torch) if n.startswith("sym_") and callable(getattr(torch, n))
} | {getattr(math, n) for n in ("ceil", "floor", "trunc", "sqrt")} | {round, torch._sym_sqrt}


def _check_target(op: Any) -> None:
    if isinstance(op, torch._ops.OpOverloadPacket):
        raise RegistryError(
            f"register() needs an overload such as {op}.default, not the packet {op}",
            fix="name each overload explicitly so a new overload never lowers by accident",
        )
    ok = isinstance(op, (torch._ops.OpOverload, torch._ops.HigherOrderOperator))
    if not ok and op not in _PY_TARGETS:
        raise RegistryError(f"cannot register a lowering for {op!r}: not an ATen overload")


def register(*ops: Any) -> Callable[[LoweringFn], LoweringFn]:
    """Register `fn` as the lowering of each overload in `ops`; a second registration raises."""

    def deco(fn: LoweringFn) -> LoweringFn:
        for op in ops:
            _check_target(op)
            if op in _TABLE:
                prev = _TABLE[op]
                raise RegistryError(
                    f"{op} is already lowered by {prev.__module__}.{prev.__qualname__}",
                    fix=f"remove one of the two registrations (the other is {fn.__module__}.{fn.__qualname__})",
                )
            _TABLE[op] = fn
        return fn

    return deco


def lookup(op: Any, location: Location | None = None) -> LoweringFn:
    """The lowering of `op`, or an UnsupportedOpError that says where the op came from."""
    fn = _TABLE.get(op)
    if fn is None:
        raise UnsupportedOpError(
            f"no JAX lowering for ATen operator {op}",
            location=location,
            fix=(
                "rewrite that line with operations dycl_jax supports (see `scripts/op_coverage.py`), "
                f"or add a lowering with @register({op}) in dycl_jax/lower/ops/"
            ),
        )
    return fn


def registered() -> dict[Any, LoweringFn]:
    """A copy of the table, for coverage reports."""
    return dict(_TABLE)
