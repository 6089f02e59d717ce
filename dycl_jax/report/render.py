"""Renders a ConversionReport with rich: a pure function from the data record to text."""
from __future__ import annotations

from io import StringIO

from rich import box
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from dycl_jax.report.record import ConversionReport, HostNode, ParamGroup, SubNetwork

# Timings keys in pipeline order, with the label shown for each; unknown keys follow in order.
_TIMING_LABELS = {
    "rewrite_s": "rewrite",
    "capture_s": "capture (export + decomposition)",
    "export_s": "  torch.export",
    "decompose_s": "  decomposition to core ATen",
    "lower_s": "lowering",
    "check_s": "trace check (eval_shape)",
    "first_call_s": "first call (trace + compile)",
    "staged_attempt_s": "staged attempt (auto)",
    "example_path_s": "example's path (capture + compile its regions)",
}


def _t(value: object) -> Text:
    # report data may contain brackets (shapes, lists); Text never reads them as rich markup
    return Text(str(value))


def _short_list(items: list[str], keep: int = 3) -> str:
    if len(items) <= keep:
        return ", ".join(items)
    return ", ".join(items[:keep]) + f", … (+{len(items) - keep})"


def _top_ops(ops: dict[str, int], keep: int = 3) -> str:
    ranked = sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))
    return _short_list([f"{name}×{count}" for name, count in ranked], keep)


def _header(report: ConversionReport) -> Panel:
    body = Table.grid(padding=(0, 2))
    body.add_column(style="bold")
    body.add_column()
    # the output structure is a pytree spec string; one line of it reads best
    outputs = "one tensor" if report.outputs == "*" else " ".join(report.outputs.split())
    body.add_row("host", _t(report.host))
    if report.host == "dispatch":
        body.add_row("why dispatch", _t(report.dispatch_reason))
        body.add_row("compiled", _t(f"{report.captures} region signatures captured, "
                                    f"{report.compilations} XLA executables"))
    if report.padded_reason:
        body.add_row("why padded", _t(f"{report.padded_reason}; staged with that value padded, calls trimmed to "
                                      "the exact result"))
    if report.integers:
        body.add_row("integers", _t(report.integers))
    if report.unrolled:
        body.add_row("unrolled", _t("\n".join(f"{u}; outputs padded, with lengths" for u in report.unrolled)))
    if report.bounded_rows:
        body.add_row("bounded rows", _t("\n".join(f"{b} (every row computed, the selected ones kept)"
                                                for b in report.bounded_rows)))
    body.add_row("inputs", _t("\n".join(report.inputs) or "(none)"))
    body.add_row("outputs", _t(outputs))
    body.add_row(
        "params",
        f"{report.num_params:,} values in {report.num_param_arrays} arrays, {report.num_buffers} buffers/constants",
    )
    return Panel(body, title=f"[bold]{escape(report.model)}.{escape(report.method)}[/bold]", title_align="left")


def compact_names(names: list[str]) -> list[str]:
    """`xs[0], xs[1], xs[2], h, h` → `xs[0..2], h×2`: one entry per variable, in order."""
    order: dict[str, list[str]] = {}
    for n in names:
        base, bracket, rest = n.partition("[")
        order.setdefault(base if bracket and rest[:-1].isdigit() else n, []).append(rest[:-1] if bracket else "")
    out = []
    for base, idx in order.items():
        numbers = sorted(int(i) for i in idx if i.isdigit())
        if numbers and len(numbers) == len(idx):
            out.append(f"{base}[{numbers[0]}]" if len(numbers) == 1 else f"{base}[{numbers[0]}..{numbers[-1]}]")
        else:
            out.append(base if len(idx) == 1 else f"{base}×{len(idx)}")
    return out


def state_summary(paths: list[str]) -> str:
    """The state a sub-network reads, by top module: `13 in layers.1`, `67 in init_conv, layers, …`."""
    if not paths:
        return ""
    parts = [p.split(".") for p in paths]
    common = []
    for level in zip(*[p[:-1] for p in parts]):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    if common:
        return f"{len(paths)} in {'.'.join(common)}"
    tops = list(dict.fromkeys(p[0] if len(p) > 1 else "(model)" for p in parts))
    return f"{len(paths)} in {_short_list(tops, 2)}"


def _io_cell(names: list[str], state: list[str], wide: bool) -> Text:
    shown = names if wide else compact_names(names)
    text = ", ".join(shown) if wide else _short_list(shown, 3)
    if state:
        text = "; ".join(x for x in (text, "state: " + (", ".join(state) if wide else state_summary(state))) if x)
    return _t(text or "-")


def _subnetwork_table(subs: list[SubNetwork], wide: bool) -> Table:
    table = Table(title="sub-networks", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("#", no_wrap=True)
    # wide enough for the longest word of a name (a file:line, the method), so none is cut
    longest = max((len(w) for sub in subs for w in sub.name.split()), default=20)
    table.add_column("what it runs", min_width=min(30, max(20, longest)), ratio=3, overflow="fold")
    table.add_column("ops", justify="right", no_wrap=True)
    table.add_column("inputs", min_width=16, ratio=2, overflow="fold")
    table.add_column("outputs", min_width=16, ratio=2, overflow="fold")
    if wide:
        table.add_column("fx graph", no_wrap=True)
        table.add_column("top ops", min_width=16)
        table.add_column("user lines", min_width=16)
    for sub in subs:
        row = [_t(sub.id or "-"), _t(sub.name), str(sub.num_nodes), _io_cell(sub.inputs, sub.state, wide),
               _io_cell(sub.outputs, [], wide)]
        if wide:
            row += [_t(sub.graph or "-"), _t(_top_ops(sub.ops, 99)), _t(", ".join(sub.source_lines) or "-")]
        table.add_row(*row)
    return table


def _param_rows(report: ConversionReport, wide: bool, keep: int = 16) -> list[ParamGroup]:
    """The groups, merged to shallower module paths until at most `keep` rows (all when wide)."""
    groups = report.param_groups
    depth = max((g.module.count(".") + 1 for g in groups), default=0)
    while not wide and len(groups) > keep and depth > 1:
        depth -= 1
        merged: dict[str, ParamGroup] = {}
        for g in groups:
            key = ".".join(g.module.split(".")[:depth])
            m = merged.setdefault(key, ParamGroup(key, 0, 0))
            m.params, m.values, m.buffers = m.params + g.params, m.values + g.values, m.buffers + g.buffers
        groups = list(merged.values())
    return groups


def _param_table(report: ConversionReport, wide: bool) -> Table:
    table = Table(title="parameters by module", title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False)
    table.add_column("module", min_width=20)
    for col in ("params", "values", "buffers"):
        table.add_column(col, justify="right", no_wrap=True)
    for g in _param_rows(report, wide):
        table.add_row(_t(g.module), str(g.params), f"{g.values:,}", str(g.buffers))
    return table


def _tree(node: HostNode, parent: Tree | None = None) -> Tree:
    style = "bold magenta" if node.kind in ("cond", "while_loop", "switch") else ""
    label = Text(node.label, style=style)
    branch = Tree(label) if parent is None else parent.add(label)
    for child in node.children:
        _tree(child, branch)
    return branch


def _host_tree(report: ConversionReport) -> Panel:
    return Panel(_tree(report.host_tree), title="host control flow", title_align="left")


def _histogram(report: ConversionReport, top: int) -> Table:
    ranked = report.op_counts.most_common()
    shown = ranked[:top]
    total = sum(report.op_counts.values())
    table = Table(title=f"ops ({total} nodes, {len(ranked)} distinct)", title_justify="left")
    table.add_column("op")
    table.add_column("count", justify="right")
    table.add_column("")
    peak = shown[0][1] if shown else 1
    for name, count in shown:
        table.add_row(_t(name), str(count), "█" * max(1, round(20 * count / peak)))
    if len(ranked) > top:
        rest = sum(c for _, c in ranked[top:])
        table.add_row(f"… {len(ranked) - top} more", str(rest), "")
    return table


def _timings(report: ConversionReport) -> Table:
    table = Table(title="timings", title_justify="left")
    table.add_column("stage")
    table.add_column("seconds", justify="right")
    cpu = {k: v for k, v in report.timings.items() if k.endswith("_cpu_s")}  # CPU time beside a stage's wall time
    if cpu:
        table.add_column("CPU seconds", justify="right")
    keys = [k for k in _TIMING_LABELS if k in report.timings]
    keys += [k for k in report.timings if k not in _TIMING_LABELS and k not in cpu]
    for key in keys:
        row = [_t(_TIMING_LABELS.get(key, key)), f"{report.timings[key]:.3f}"]
        if cpu:
            value = cpu.get(key[:-2] + "_cpu_s")
            row.append("" if value is None else f"{value:.3f}")
        table.add_row(*row)
    return table


def _parity(parity: dict[str, float]) -> Table:
    table = Table(title="parity vs torch", title_justify="left")
    table.add_column("check")
    table.add_column("value", justify="right")
    labels = {
        "cases": ("input cases compared", "{:.0f}"),
        "float_outputs": ("float outputs", "{:.0f}"),
        "max_abs_diff": ("max |torch - jax|", "{:.3g}"),
        "int_outputs": ("integer/bool outputs", "{:.0f}"),
        "int_match_rate": ("integer/bool exact-match rate", "{:.4f}"),
        "float_error": ("observed float error (cases that agree)", "{:.3g}"),
        "decision_flips": ("cases differing by a near-threshold decision flip", "{:.0f}"),
        "mismatches": ("cases differing otherwise (real mismatches)", "{:.0f}"),
    }
    for key, value in parity.items():
        label, fmt = labels.get(key, (key, "{:.4g}"))
        table.add_row(_t(label), fmt.format(value))
    return table


def _flips(report: ConversionReport) -> Panel:
    lines = []
    for f in report.flips:
        where = f"{f.site}: torch {f.torch_value}, JAX {f.jax_value}, margin {f.margin:.3g}" if f.site else \
            "same decisions, different values"
        verdict = (f"near-threshold flip: the margin is within the observed float error {f.float_error:.3g}, "
                   "so float rounding (torch vs XLA) decided it, not the conversion") if f.near_threshold else \
            "MISMATCH: not explained by float rounding"
        lines.append(f"• case {f.case}: {where} — {verdict}")
    real = sum(not f.near_threshold for f in report.flips)
    return Panel(_t("\n".join(lines)), title="cases that differ from torch",
                 border_style="red" if real else "yellow")


def _rewritten(report: ConversionReport, wide: bool) -> Panel:
    keep = 99 if wide else 4
    lines = []
    for f in report.rewritten:
        # (a staged island and its host version hold the same site: named once)
        parts = [f"dynamic: {_short_list(list(dict.fromkeys(f.dynamic_sites)), keep) or '-'}"]
        if f.static_sites:
            parts.append(f"static: {_short_list(f.static_sites, keep)}")
        if f.patched:
            parts.append(f"runs as {_short_list(f.patched, 2 if not wide else 99)}")
        lines.append(f"• {f.name} ({f.location}): " + "; ".join(parts))
    return Panel(_t("\n".join(lines)), title="rewritten functions (decision sites)", title_align="left")


def report_renderable(report: ConversionReport, *, top_ops: int = 12, wide: bool = False) -> RenderableType:
    """The report as one rich renderable (the CLI prints it to a colour console). `wide`: every
    name and path in full, plus each sub-network's fx graph name, ops and user lines."""
    parts: list[RenderableType] = [
        _header(report),
        _subnetwork_table(report.subnetworks, wide),
        *([_param_table(report, wide)] if report.param_groups else []),
        *([_rewritten(report, wide)] if report.rewritten else []),
        _host_tree(report),
        _histogram(report, top_ops),
        _timings(report),
    ]
    if report.host_statements:
        text = _t("\n".join(f"• {w}" for w in report.host_statements))
        parts.append(Panel(text, title="statements run on the host (by JAX ops or torch), and why", border_style="cyan"))
    if report.warnings:
        text = _t("\n".join(f"• {w}" for w in report.warnings))
        parts.append(Panel(text, title="warnings", border_style="yellow"))
    if report.parity:
        parts.append(_parity(report.parity))
    if report.flips:
        parts.append(_flips(report))
    return Group(*parts)


def render_report(report: ConversionReport, *, width: int = 100, top_ops: int = 12, wide: bool = False) -> str:
    """The report as plain text (no colour codes), `width` columns wide."""
    buf = StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False, legacy_windows=False)
    console.print(report_renderable(report, top_ops=top_ops, wide=wide))
    return buf.getvalue()
