"""Renders a ConversionReport with rich: a pure function from the data record to text."""
from __future__ import annotations

from io import StringIO

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from dycl_jax.report.record import ConversionReport, HostNode, SubNetwork

# Timings keys in pipeline order, with the label shown for each; unknown keys follow in order.
_TIMING_LABELS = {
    "capture_s": "capture (torch.export)",
    "lower_s": "lowering",
    "check_s": "trace check (eval_shape)",
    "first_call_s": "first call (trace + compile)",
    "staged_attempt_s": "staged attempt (auto)",
    "rewrite_s": "dispatch rewrite",
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
    if report.integers:
        body.add_row("integers", _t(report.integers))
    if report.unrolled:
        body.add_row("unrolled", _t("\n".join(f"{u}; outputs padded, with lengths" for u in report.unrolled)))
    body.add_row("inputs", _t("\n".join(report.inputs) or "(none)"))
    body.add_row("outputs", _t(outputs))
    body.add_row(
        "params",
        f"{report.num_params:,} values in {report.num_param_arrays} arrays, {report.num_buffers} buffers/constants",
    )
    return Panel(body, title=f"[bold]{escape(report.model)}.{escape(report.method)}[/bold]", title_align="left")


def _subnetwork_table(subs: list[SubNetwork]) -> Table:
    table = Table(title="sub-networks", title_justify="left", expand=False)
    table.add_column("name", no_wrap=True)
    table.add_column("nodes", justify="right")
    table.add_column("inputs", overflow="fold")
    table.add_column("outputs", overflow="fold")
    table.add_column("top ops", overflow="fold")
    table.add_column("user lines", overflow="fold")
    for sub in subs:
        table.add_row(
            _t(sub.name),
            str(sub.num_nodes),
            _t(f"{len(sub.inputs)}: {_short_list(sub.inputs, 2)}" if sub.inputs else "0"),
            _t(_short_list(sub.outputs, 2)),
            _t(_top_ops(sub.ops)),
            _t(_short_list(sub.source_lines, 4) or "-"),
        )
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
    keys = [k for k in _TIMING_LABELS if k in report.timings]
    keys += [k for k in report.timings if k not in _TIMING_LABELS]
    for key in keys:
        table.add_row(_t(_TIMING_LABELS.get(key, key)), f"{report.timings[key]:.3f}")
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


def _rewritten_table(report: ConversionReport) -> Table:
    table = Table(title="rewritten functions", title_justify="left")
    for col in ("function", "defined at", "dynamic sites", "static sites", "patched on"):
        table.add_column(col)
    for f in report.rewritten:
        table.add_row(_t(f.name), _t(f.location), _t(_short_list(f.dynamic_sites, 4)),
                      _t(_short_list(f.static_sites, 4)), _t(_short_list(f.patched, 2)))
    return table


def report_renderable(report: ConversionReport, *, top_ops: int = 12) -> RenderableType:
    """The report as one rich renderable (the CLI prints it to a colour console)."""
    parts: list[RenderableType] = [
        _header(report),
        _subnetwork_table(report.subnetworks),
        *([_rewritten_table(report)] if report.rewritten else []),
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


def render_report(report: ConversionReport, *, width: int = 100, top_ops: int = 12) -> str:
    """The report as plain text (no colour codes), `width` columns wide."""
    buf = StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False, legacy_windows=False)
    console.print(report_renderable(report, top_ops=top_ops))
    return buf.getvalue()
