"""The conversion report as plain data; rendering lives in render.py."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class SubNetwork:
    """A static sub-network: one fx graph with no control flow of its own."""

    name: str
    num_nodes: int
    inputs: list[str]
    outputs: list[str]
    ops: dict[str, int]
    source_lines: list[str] = field(default_factory=list)


@dataclass
class HostNode:
    """A node of the host control-flow tree (cond, while, switch, or a sub-network call)."""

    kind: str
    label: str
    children: list["HostNode"] = field(default_factory=list)


@dataclass
class ConversionReport:
    """Everything a user may want to know about one conversion."""

    model: str
    method: str
    host: str
    inputs: list[str]
    outputs: str
    num_params: int
    num_param_arrays: int
    num_buffers: int
    subnetworks: list[SubNetwork]
    host_tree: HostNode
    op_counts: Counter[str]
    timings: dict[str, float]
    warnings: list[str] = field(default_factory=list)
    parity: dict[str, float] = field(default_factory=dict)
