"""Builds the ConversionReport from the captured program and its lowered graphs."""
from __future__ import annotations

from collections import Counter

import torch
import torch.fx
import torch.utils._pytree as pytree

from dycl_jax.capture.export import CapturedProgram
from dycl_jax.lower.interpreter import LoweredGraph, node_location
from dycl_jax.report.record import ConversionReport, HostNode, RewrittenFunction, SubNetwork
from dycl_jax.rewrite.api import RewriteRecord
from dycl_jax.source.origins import is_decision

_CONTROL = {"cond", "while_loop"}


def _op_name(node: torch.fx.Node) -> str:
    return str(getattr(node.target, "__name__", node.target)).replace("aten.", "")


def _subnetwork(graph: LoweredGraph) -> SubNetwork:
    ops: Counter[str] = Counter(_op_name(s.node) for s in graph.steps)
    lines = sorted({f"{loc.file.rsplit('/', 1)[-1]}:{loc.line}" for s in graph.steps if (loc := node_location(s.node))})
    outs = graph.output_node.args[0] if graph.output_node is not None else ()
    return SubNetwork(
        name=graph.name,
        num_nodes=len(graph.steps),
        inputs=[p.name for p in graph.placeholders],
        outputs=[getattr(o, "name", str(o)) for o in (outs if isinstance(outs, (list, tuple)) else [outs])],
        ops=dict(ops),
        source_lines=lines,
    )


def _host_tree(graph: LoweredGraph) -> HostNode:
    node = HostNode("graph", f"{graph.name} ({len(graph.steps)} ops)")
    for step in graph.steps:
        name = _op_name(step.node)
        if name in _CONTROL:
            loc = node_location(step.node)
            where = f" at {loc.file.rsplit('/', 1)[-1]}:{loc.line}" if loc else ""
            subs = [a for a in step.node.args if isinstance(a, torch.fx.Node) and a.op == "get_attr"]
            child = HostNode(name, f"{name}{where}")
            child.children = [_host_tree(graph.attrs[s]) for s in subs if isinstance(graph.attrs.get(s), LoweredGraph)]
            node.children.append(child)
    return node


def _all_graphs(graph: LoweredGraph) -> list[LoweredGraph]:
    out = [graph]
    for sub in graph.subgraphs():
        out.extend(_all_graphs(sub))
    return out


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
    graphs = _all_graphs(graph)
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
        subnetworks=[_subnetwork(g) for g in graphs],
        host_tree=_host_tree(graph),
        op_counts=ops,
        timings=timings,
        warnings=[w for f in (rewrite.functions if rewrite else []) for w in f.warnings],
        rewritten=_rewritten(rewrite),
        unrolled=[u for f in (rewrite.functions if rewrite else []) for u in f.unrolled],
    )
