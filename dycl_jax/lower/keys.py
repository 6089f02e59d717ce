"""The random key a program's random ops draw from (train-mode dropout, torch.rand, ...).

A program that draws random numbers takes one key per call. While it is traced, every random
op takes `fold_in(key, n)` with its own number n, counted in trace order, so the same key gives
the same values and different keys different ones; a loop body folds a per-iteration key
carried by the loop (ops/control_flow.py), so each iteration draws afresh.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any, Iterator

import jax

from dycl_jax.errors import CallError, DyclError
from dycl_jax.lower.interpreter import current_node, node_location


@dataclass
class KeyStream:
    key: Any
    drawn: list[int] = field(default_factory=lambda: [0])  # shared by nested streams: numbers never repeat


_STREAM: contextvars.ContextVar[KeyStream | None] = contextvars.ContextVar("dycl_keys", default=None)


@contextlib.contextmanager
def key_stream(key: Any, drawn: list[int] | None = None) -> Iterator[KeyStream]:
    """Random ops traced inside draw from `key`."""
    stream = KeyStream(key, drawn if drawn is not None else [0])
    token = _STREAM.set(stream)
    try:
        yield stream
    finally:
        _STREAM.reset(token)


def current_stream() -> KeyStream | None:
    """The stream random ops draw from right now, if any."""
    return _STREAM.get()


def next_key(op: str) -> Any:
    """A fresh key for one random op; a located error when the program was given none."""
    stream = _STREAM.get()
    if stream is None:
        node = current_node()
        raise DyclError(
            f"{op} draws random numbers, which a model converted for inference cannot do",
            location=node_location(node) if node is not None else None,
            fix="convert with to_jax(..., train=True) and call it with key=jax.random.key(...) "
                "(or let it draw from jm.rngs), or draw the random values outside and pass them in",
        )
    if stream.key is None:
        raise CallError(f"the converted method draws random numbers ({op}) but was given no key",
                        fix="pass key=jax.random.key(seed) (jm.apply needs one; jm(...) draws from jm.rngs)")
    n = stream.drawn[0]
    stream.drawn[0] += 1
    return jax.random.fold_in(stream.key, n)
