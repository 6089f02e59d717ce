"""Builds the ConversionReport of a dispatch-host model from what its host has run so far."""
from __future__ import annotations

import os
from collections import Counter

from dycl_jax.capture.export import StateEntry
from dycl_jax.host.dispatch import DIRECT, Compiled, DispatchHost
from dycl_jax.report.build import _op_name, _rewritten, _subnetwork
from dycl_jax.report.record import ConversionReport, HostNode
from dycl_jax.rewrite.api import RewriteRecord
from dycl_jax.runtime.signature import CallSignature


def _part_kind(spec, part) -> str:
    kinds = {type(e).__name__ if isinstance(e, Compiled) else e for e in part.cache.values()}
    if part.host_reason is not None:
        return "did not stage (host version runs)" if spec.kind == "island" else "host"
    if "Compiled" in kinds:
        return "staged island"
    return "python" if kinds == {DIRECT} else "not run yet"


def _host_tree(host: DispatchHost, rewrite: RewriteRecord) -> HostNode:
    root = HostNode("dispatch", f"dispatch host: {rewrite.model}.{rewrite.method}")
    by_file: dict[str, HostNode] = {}
    for f in rewrite.functions:
        node = HostNode("function", f"{f.name} ({os.path.basename(f.file)}:{f.line})")
        by_file[f.generated] = node
        root.children.append(node)
        for site in f.sites:
            if not site.static:
                node.children.append(HostNode("decision", f"{site.label} (read on the host)"))
    for st in host.regions.values():
        spec = st.spec
        parent = next((n for f, n in zip(rewrite.functions, root.children) if f.file == spec.file), root)
        for part in st.parts:
            first, last = spec.statements[part.first], spec.statements[part.stop - 1]
            where = f"{os.path.basename(spec.file)}:{first.line}" + (f"-{last.line}" if last.line != first.line else "")
            kind = _part_kind(spec, part)
            label = f"{kind}: {where} ({part.stop - part.first} statements, {len(part.cache)} signatures)"
            parent.children.append(HostNode(kind, label))
    return root


def build_dispatch_report(model_name: str, method: str, host: DispatchHost, signature: CallSignature,
                          state: list[StateEntry], timings: dict[str, float], rewrite: RewriteRecord,
                          reason: str | None) -> ConversionReport:
    graphs = list(host.graphs.values())
    ops: Counter[str] = Counter()
    for g in graphs:
        ops.update(_op_name(s.node) for s in g.steps)
    params = [e for e in state if e.kind == "param"]
    statements, in_torch = [], []
    for st in host.regions.values():
        for part in st.parts:
            if part.host_reason is not None and st.spec.kind == "region":
                s = st.spec.statements[part.first]
                line = f"{os.path.basename(st.spec.file)}:{s.line} `{s.code}`: {part.host_reason}"
                if part.in_torch is not None:
                    line += f"; ran in torch ({part.in_torch})"
                    in_torch.append(line)
                elif part.jax_ops:
                    line += f"; computed by JAX ops on the host ({', '.join(part.jax_ops)})"
                else:
                    line += "; no ATen op (it reads values the host holds)"
                statements.append(line)
    return ConversionReport(
        model=model_name,
        method=method,
        host="dispatch",
        inputs=[f"{s.name}: {s.describe()}" for s in signature.inputs],
        outputs="(the method's own structure; shapes may differ per path)",
        num_params=sum(e.tensor.numel() for e in params),
        num_param_arrays=len(params),
        num_buffers=len(state) - len(params),
        subnetworks=[_subnetwork(g) for g in graphs],
        host_tree=_host_tree(host, rewrite),
        op_counts=ops,
        timings=dict(timings),
        warnings=[w for f in rewrite.functions for w in f.warnings],
        rewritten=_rewritten(rewrite),
        dispatch_reason=reason or 'host="dispatch" was requested',
        host_statements=statements,
        torch_statements=in_torch,
        captures=host.captures,
        compilations=host.compilations(),
    )
