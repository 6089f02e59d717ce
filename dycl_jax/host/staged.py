"""Staged host: the whole method, control flow included, as one pure JAX function."""
from __future__ import annotations

from typing import Any

from dycl_jax.lower.interpreter import LoweredGraph
from dycl_jax.lower.keys import key_stream


def staged_fn(graph: LoweredGraph):
    """(state values, tensor inputs) -> flat outputs; torch.cond/while_loop are lax ops inside."""

    def run(state: list[Any], tensors: list[Any]) -> tuple[Any, ...]:
        return graph(*state, *tensors)

    return run


def keyed_fn(graph: LoweredGraph, n_updates: int):
    """The training form: (state values, tensor inputs, key) -> (flat outputs, updated buffers).

    The graph returns the buffers it updates (BatchNorm statistics) before the method's
    outputs, as torch.export orders them; random ops draw from `key` (lower/keys.py).
    """

    def run(state: list[Any], tensors: list[Any], key: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        with key_stream(key):
            outs = graph(*state, *tensors)
        return outs[n_updates:], outs[:n_updates]

    return run
