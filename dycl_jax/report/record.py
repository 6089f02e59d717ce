"""The conversion report as plain data; rendering lives in render.py."""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field


@dataclass
class SubNetwork:
    """A static sub-network: one fx graph with no control flow of its own.

    `name` says what it is in the user's code (`then-branch of if at model.py:113`, or the
    method); `inputs` / `outputs` are the user's variable names where the rewrite knows them;
    `state` the parameter and buffer paths it reads; `id` its place in the host tree (`1.2`);
    `graph` the fx graph's own name (`true_graph_0`)."""

    name: str
    num_nodes: int
    inputs: list[str]
    outputs: list[str]
    ops: dict[str, int]
    source_lines: list[str] = field(default_factory=list)
    id: str = ""
    graph: str = ""
    state: list[str] = field(default_factory=list)


@dataclass
class ParamGroup:
    """The state one module owns directly: `layers.1.conv1: 2 params, 9,216 values`."""

    module: str
    params: int
    values: int
    buffers: int = 0


@dataclass
class HostNode:
    """A node of the host control-flow tree (cond, while, switch, or a sub-network call)."""

    kind: str
    label: str
    children: list["HostNode"] = field(default_factory=list)


@dataclass
class RewrittenFunction:
    """A user function the rewrite stage replaced, and the control-flow sites it holds."""

    name: str
    location: str  # file:line of its definition
    dynamic_sites: list[str]  # e.g. "if@model.py:42": became graph control flow when tensors
    static_sites: list[str]  # provably Python: left as plain statements, specialised
    patched: list[str] = field(default_factory=list)  # "forward on blocks.0", ...


@dataclass
class DecisionFlip:
    """A parity case whose outputs differ from torch's, explained or not by a near-threshold decision.

    `site` is the first decision that differs from torch's (or, where torch's decisions are not
    known, the closest JAX decision); `margin` its JAX margin (jm.trace); `near_threshold` when
    that margin is within `float_error`, the float error observed on the cases that agree: a
    rounding difference between torch and XLA flipped it. Otherwise a real mismatch."""

    case: int
    site: str
    torch_value: str
    jax_value: str
    margin: float
    float_error: float
    near_threshold: bool


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
    rewritten: list[RewrittenFunction] = field(default_factory=list)
    # filled by whoever runs torch and JAX side by side (`dycl-jax convert`, report/parity.py):
    # cases, float_outputs, max_abs_diff, int_outputs, int_match_rate; where cases disagree also
    # float_error, decision_flips (near-threshold) and mismatches
    parity: dict[str, float] = field(default_factory=dict)
    # the parity cases whose outputs differ, each a near-threshold decision flip or a real mismatch
    flips: list[DecisionFlip] = field(default_factory=list)
    # dispatch host: why it was chosen, which statements run on the host (and why), and how
    # many graphs were captured and XLA executables compiled so far
    dispatch_reason: str = ""
    # staged host as one padded program: the construct that would not stage as written, and why
    padded_reason: str = ""
    host_statements: list[str] = field(default_factory=list)
    torch_statements: list[str] = field(default_factory=list)  # those of them torch ran (no exact JAX form)
    captures: int = 0
    compilations: int = 0
    # how torch.int64 is held (int32 where every value is proven to fit, else 64-bit) and why
    integers: str = ""
    # parameters and buffers by the module that owns them, in state order
    param_groups: list[ParamGroup] = field(default_factory=list)
    # decode loops unrolled for `max_len` (outputs padded, with lengths): "while@m.py:12 (at most 8 iterations)"
    unrolled: list[str] = field(default_factory=list)
    # row selections staged as masked dense computations over all rows, proved row-wise
    # (rewrite/rows.py, capture/bounded_rows.py): "moe.py:36: sel = (expert_idx == e).nonzero(...)[0]"
    bounded_rows: list[str] = field(default_factory=list)


def report_to_dict(report: ConversionReport) -> dict:
    """The report as JSON-ready data (dataclasses.asdict; the op Counter becomes a dict)."""
    data = asdict(report)
    data["op_counts"] = dict(report.op_counts)
    return data


def _host_node(data: dict) -> HostNode:
    return HostNode(data["kind"], data["label"], [_host_node(c) for c in data.get("children", [])])


def report_from_dict(data: dict) -> ConversionReport:
    """Inverse of `report_to_dict` (e.g. for a report written by `dycl-jax convert --json`)."""
    fields = dict(data)
    fields["subnetworks"] = [SubNetwork(**s) for s in data["subnetworks"]]
    fields["host_tree"] = _host_node(data["host_tree"])
    fields["op_counts"] = Counter(data["op_counts"])
    fields["rewritten"] = [RewrittenFunction(**r) for r in data.get("rewritten", [])]
    fields["flips"] = [DecisionFlip(**f) for f in data.get("flips", [])]
    fields["param_groups"] = [ParamGroup(**g) for g in data.get("param_groups", [])]
    return ConversionReport(**fields)
