"""Builds the ConversionReport of a dispatch-host model from what its host has run so far."""
from __future__ import annotations

import os
from collections import Counter

from dycl_jax.capture.export import StateEntry
from dycl_jax.host import chunks
from dycl_jax.host.dispatch import CARRIED, DIRECT, OVER_BUDGET, Compiled, DispatchHost
from dycl_jax.report.build import _op_name, _rewritten, _subnetwork, param_groups
from dycl_jax.report.naming import NamedGraph, Value
from dycl_jax.report.record import ConversionReport, HostNode
from dycl_jax.rewrite.api import RewriteRecord
from dycl_jax.rewrite.names import readable

_KIND_WORDS = {"region": "statements", "island": "island", "tail island": "tail island",
               "loop chunk": f"{chunks.STEPS} iterations of the loop, or up to its stop within {chunks.REACH}"}
from dycl_jax.runtime.signature import CallSignature


def _part_kind(spec, part) -> str:
    kinds = {type(e).__name__ if isinstance(e, Compiled) else e for e in part.cache.values()}
    if part.host_reason is not None or kinds == {OVER_BUDGET}:
        return "did not stage (host version runs)" if spec.kind == "island" else "host"
    if "Compiled" in kinds and chunks.is_chunk(spec):
        return f"loop run {chunks.STEPS} iterations per program (to its stop where within {chunks.REACH})"
    if "Compiled" in kinds:
        return "staged island"
    return "python" if kinds and kinds <= {DIRECT, CARRIED} else "not run yet"


def _where(spec, part) -> str:
    first, last = spec.statements[part.first], spec.statements[part.stop - 1]
    return f"{os.path.basename(spec.file)}:{first.line}" + (f"-{last.line}" if last.line != first.line else "")


def _programs(host: DispatchHost) -> dict[int, tuple]:
    """id of each shared jitted program -> (spec, part) of the first part that runs it."""
    found: dict[int, tuple] = {}
    for st in host.regions.values():
        for part in st.parts:
            for entry in part.cache.values():
                if isinstance(entry, Compiled):
                    found.setdefault(id(entry.fn), (st.spec, part))
    return found


def _named_regions(host: DispatchHost, state: list[StateEntry]) -> list[NamedGraph]:
    """Each compiled region graph, named by its statements and with the user's input names."""
    by_placeholder = {f"{k}_m_{e.path.replace('.', '_')}": e.path for e in state for k in ("p", "b", "c")}
    programs = _programs(host)
    named = []
    for n, (fp, graph) in enumerate(host.graphs.items(), 1):
        exe = host.executables.get(fp)
        spec_part = programs.get(id(exe))
        kind, _, where = graph.name.partition("@")
        title = f"{_KIND_WORDS.get(kind, kind)} at {where}"
        if spec_part is not None:
            spec, part = spec_part
            title = f"{_KIND_WORDS['tail island' if spec.tail else 'loop chunk' if chunks.is_chunk(spec) else spec.kind]} " \
                f"at {_where(spec, part)}"
            if chunks.is_chunk(spec) and spec.resume is not None:
                # (a first chunk holding the statements before the loop, and maybe those after it)
                title += f" (the loop at line {spec.loop_line}, the statements around it)"
        ins, outs = host.io_names.get(id(exe), ([], []))
        # torch.export lifts every parameter of the model into each region: name those it reads
        values = [Value(by_placeholder[p.name], state=True) for p in graph.placeholders
                  if p.name in by_placeholder and p.users]
        user = [p for p in graph.placeholders if p.name not in by_placeholder]
        values += [Value(readable(a)) for a in (ins if len(ins) == len(user) else [p.name for p in user])]
        item = NamedGraph(graph, str(n), title, "", values)
        result = graph.output_node.args[0] if graph.output_node is not None else ()
        leaves = list(result) if isinstance(result, (list, tuple)) else [result]
        item.outputs = [readable(o) for o in outs] if len(outs) == len(leaves) else [getattr(o, "name", str(o)) for o in leaves]
        named.append(item)
    return named


def _host_tree(host: DispatchHost, rewrite: RewriteRecord) -> HostNode:
    root = HostNode("dispatch", f"dispatch host: {rewrite.model}.{rewrite.method}")
    by_file: dict[str, HostNode] = {}
    for f in rewrite.functions:
        node = HostNode("function", f"{f.name} ({os.path.basename(f.file)}:{f.line})")
        by_file[f.generated] = node
        root.children.append(node)
        for site in f.sites:
            if not site.static:  # (a site inside a staged island is decided in its program)
                how = "read on the host" if site.label in host.sites_read else "not read on the host so far"
                node.children.append(HostNode("decision", f"{site.label} ({how})"))
    for st in host.regions.values():
        spec = st.spec
        parent = next((n for f, n in zip(rewrite.functions, root.children) if f.file == spec.file), root)
        for part in st.parts:
            where = _where(spec, part)
            kind = _part_kind(spec, part)
            label = f"{kind}: {where} ({part.stop - part.first} statements, {len(part.cache)} signatures)"
            if spec.kind == "island" and part.host_reason is not None:  # why it did not stage
                label += f": {part.host_reason}"
            elif part.over_budget is not None:
                n = sum(1 for e in part.cache.values() if e == OVER_BUDGET)
                label += f"; its host version ran at {n} signatures: {part.over_budget}"
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
                    line += f"; computed by JAX/numpy ops on the host ({', '.join(part.jax_ops)})"
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
        subnetworks=[_subnetwork(g) for g in _named_regions(host, state)],
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
        param_groups=param_groups(state),
        bounded_rows=[f"{os.path.basename(loc.file)}:{loc.line}: {loc.code}"
                      for _, loc in sorted(host.dense_rows.items())],
    )
