"""Staged host: the whole method, control flow included, as one pure JAX function."""
from __future__ import annotations

from typing import Any

from dycl_jax.lower.interpreter import LoweredGraph


def staged_fn(graph: LoweredGraph):
    """(state values, tensor inputs) -> flat outputs; torch.cond/while_loop are lax ops inside."""

    def run(state: list[Any], tensors: list[Any]) -> tuple[Any, ...]:
        return graph(*state, *tensors)

    return run
