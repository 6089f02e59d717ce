"""Builds the ConversionReport from the captured program and its lowered graphs."""
from __future__ import annotations

from collections import Counter

import torch
import torch.fx
import torch.utils._pytree as pytree

from torch.export.graph_signature import InputKind

from dycl_jax.capture.export import CapturedProgram, StateEntry, _strip
from dycl_jax.lower.interpreter import LoweredGraph, node_location
from dycl_jax.report.naming import NamedGraph, Value, flat, module_of, name_program
from dycl_jax.report.record import ConversionReport, HostNode, ParamGroup, RewrittenFunction, SubNetwork
from dycl_jax.rewrite.api import RewriteRecord
from dycl_jax.source.origins import is_decision

def _op_name(node: torch.fx.Node) -> str:
    return str(getattr(node.target, "__name__", node.target)).replace("aten.", "")


def _subnetwork(named: NamedGraph) -> SubNetwork:
    graph = named.graph
    ops: Counter[str] = Counter(_op_name(s.node) for s in graph.steps)
    lines = sorted({f"{loc.file.rsplit('/', 1)[-1]}:{loc.line}" for s in graph.steps if (loc := node_location(s.node))},
                   key=_line_key)
    variables = list(dict.fromkeys(v.name for v in named.inputs if not v.state))
    return SubNetwork(
        name=named.title,
        num_nodes=len(graph.steps),
        inputs=variables,
        outputs=named.outputs,
        ops=dict(ops),
        source_lines=lines,
        id=named.id,
        graph=graph.name,
        state=list(dict.fromkeys(v.name for v in named.inputs if v.state)),
    )


def _line_key(where: str) -> tuple[str, int]:
    file, _, line = where.rpartition(":")
    return (file, int(line)) if line.isdigit() else (where, 0)


def _host_tree(named: NamedGraph) -> HostNode:
    node = HostNode("graph", f"{named.id} {named.title} ({len(named.graph.steps)} ops)")
    by_node: dict[int, HostNode] = {}
    for child in named.children:
        if child.construct not in by_node:  # the graphs of one control node hang under it
            kind = "while_loop" if child.title.startswith(("test of while", "body of while")) else "cond"
            by_node[child.construct] = HostNode(kind, site_title(child.site))
            node.children.append(by_node[child.construct])
        by_node[child.construct].children.append(_host_tree(child))
    return node


def site_title(label: str) -> str:
    """`if@m.py:12` → `if at m.py:12`; early-exit guards say what they are."""
    kind, _, where = label.partition("@")
    words = {"guard": "early-exit guard", "elif": "if/elif chain", "ifexp": "conditional expression"}
    return f"{words.get(kind, kind)} at {where}" if where else label


def param_groups(entries: list[StateEntry]) -> list[ParamGroup]:
    """Parameters and buffers by owning module path, in state order."""
    groups: dict[str, ParamGroup] = {}
    for e in entries:
        g = groups.setdefault(module_of(e.path), ParamGroup(module_of(e.path), 0, 0))
        if e.kind == "param":
            g.params += 1
            g.values += e.tensor.numel()
        else:
            g.buffers += 1
    return list(groups.values())


def _placeholder_values(cap: CapturedProgram) -> list[Value]:
    """The top graph's placeholders in order: state paths, and the method's inputs by name."""
    inputs = iter(cap.inputs)
    values = []
    for spec in cap.ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            values.append(Value(next(inputs).name))
        else:
            values.append(Value(_strip(spec.target or spec.arg.name), state=True))
    return values


def _describe_outputs(cap: CapturedProgram) -> str:
    """The output structure with each leaf as dtype[shape], e.g. (float32[1, 10], int64[])."""
    out = next(n for n in cap.ep.graph.nodes if n.op == "output").args[0]
    leaves = []
    for node in out[len(cap.mutations):]:  # a train-mode program returns its buffer updates first
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if isinstance(val, torch.Tensor):
            dims = ", ".join(str(d) if isinstance(d, int) else "B" for d in val.shape)
            leaves.append(_Leaf(f"{str(val.dtype).replace('torch.', '')}[{dims}]"))
        else:
            leaves.append(_Leaf(repr(node)))
    return repr(pytree.tree_unflatten(leaves, cap.out_spec))


class _Leaf(str):
    def __repr__(self) -> str:  # print without quotes inside containers
        return str(self)


def _rewritten(record: RewriteRecord | None) -> list[RewrittenFunction]:
    if record is None:
        return []
    return [
        RewrittenFunction(
            name=f.name,
            location=f"{f.file.rsplit('/', 1)[-1]}:{f.line}",
            dynamic_sites=[s.label for s in f.sites if not s.static and is_decision(s.label)],
            static_sites=[s.label for s in f.sites if s.static],
            patched=list(f.patched),
        )
        for f in record.functions
    ]


def build_report(
    model_name: str,
    method: str,
    host: str,
    cap: CapturedProgram,
    graph: LoweredGraph,
    timings: dict[str, float],
    rewrite: RewriteRecord | None = None,
) -> ConversionReport:
    named = name_program(graph, f"{model_name}.{method}", _placeholder_values(cap))
    graphs = [n.graph for n in flat(named)]
    params = [e for e in cap.state if e.kind == "param"]
    ops: Counter[str] = Counter()
    for g in graphs:
        ops.update(_op_name(s.node) for s in g.steps)
    return ConversionReport(
        model=model_name,
        method=method,
        host=host,
        inputs=[f"{s.name}: {s.describe()}" for s in cap.inputs],
        outputs=_describe_outputs(cap),
        num_params=sum(e.tensor.numel() for e in params),
        num_param_arrays=len(params),
        num_buffers=len(cap.state) - len(params),
        subnetworks=[_subnetwork(g) for g in flat(named)],
        host_tree=_host_tree(named),
        op_counts=ops,
        timings=timings,
        warnings=[w for f in (rewrite.functions if rewrite else []) for w in f.warnings],
        rewritten=_rewritten(rewrite),
        param_groups=param_groups(cap.state),
        unrolled=[u for f in (rewrite.functions if rewrite else []) for u in f.unrolled],
        bounded_rows=[f"{loc.file.rsplit('/', 1)[-1]}:{loc.line}: {loc.code}" for loc in cap.bounded_rows],
    )
