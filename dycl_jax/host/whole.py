"""The dispatch host's shortest way for a method whose whole body is one staged island: the island's
program called straight from the caller's tensors, per input signature already compiled."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import jax
import torch

from dycl_jax.host import values
from dycl_jax.rewrite.regions import defined

MISSED = object()  # no way known for this call: the host's usual way runs


@dataclass(frozen=True)
class Way:
    """One signature's program, and where its tensor inputs come from."""

    region: Any  # the island's RegionState: the way holds while the host still has it, unsplit
    part: Any  # its only Part (a part that turned out to need the host has host_reason set)
    # its Compiled program: .fn(state inputs, tensor inputs) -> flat outputs, ._state_inputs(state)
    # picks the entries it reads, .out_tree (read per call: a profiler may wrap .fn)
    program: Any
    order: tuple[int, ...]  # per program tensor input: its position among the call's tensors


class WholeIsland:
    """Ways by the (shape, dtype) of each tensor argument. A way is learned from a call that took
    the host's own short way (`DispatchHost._direct`) through a program that needs nothing around
    its call (no update of an input, no view the host tracks, no Python value computed beside it),
    so calling that program directly gives what the host gives."""

    def __init__(self) -> None:
        self.ways: dict[tuple, Way | None] = {}

    @staticmethod
    def key(tensors: Sequence[Any]) -> tuple:
        return tuple([(t.shape, t.dtype) for t in tensors])

    def known(self, tensors: Sequence[Any]) -> bool:
        """Whether this signature was learned already (with a way or without one)."""
        return self.key(tensors) in self.ways

    def learn(self, tensors: Sequence[Any], way: Way | None) -> None:
        """This signature's way, or None where its program needs the host's own way."""
        self.ways[self.key(tensors)] = way

    def call(self, regions: dict, spec_id: int, state: Sequence[Any], tensors: Sequence[Any]) -> Any:
        """The method's outputs, or MISSED."""
        way = self.ways.get(self.key(tensors))
        if way is None or regions.get(spec_id) is not way.region or way.region.parts[0] is not way.part \
                or way.part.host_reason is not None:
            return MISSED
        xs = [values.to_host(tensors[j]) if isinstance(tensors[j], torch.Tensor) else tensors[j] for j in way.order]
        program = way.program
        flat = list(program.fn(program._state_inputs(state), xs))
        outs = jax.tree_util.tree_unflatten(program.out_tree, flat)[0]  # (the part's outputs, ...)
        return values.outputs_to_jax(defined(outs[0]))  # the island's one output: the method's result
