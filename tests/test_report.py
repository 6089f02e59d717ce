"""The conversion report: names in the user's terms, legible at 80 columns, JSON round trip."""
from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest
import torch

import dycl_jax
from cli_models import GatedNet, Shrink
from dycl_jax.report.record import (ConversionReport, HostNode, ParamGroup, SubNetwork, report_from_dict,
                                    report_to_dict)
from dycl_jax.report.render import compact_names, render_report, state_summary

GOLDEN = Path(__file__).parent / "golden"


def golden(name: str, text: str) -> None:
    """Compare with tests/golden/NAME; DYCL_UPDATE_GOLDEN=1 rewrites it."""
    path = GOLDEN / name
    if os.environ.get("DYCL_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; rerun with DYCL_UPDATE_GOLDEN=1 if that is intended"


def assert_legible(text: str, report: ConversionReport) -> None:
    """No cell is wrapped one character at a time: every word of every sub-network name and
    every variable shown stays whole on one line, and no cell line is a 1-2 character scrap."""
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("sub-networks")))
    end = next(i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith((" ", "─", "#"))
               and not re.match(r"^\d", lines[i]))
    table = lines[start + 3:end]
    whole = {w.strip(",;") for sub in report.subnetworks for w in " ".join(sub.inputs + sub.outputs).split()}
    for line in table:
        for scrap in filter(None, re.split(r"\s{2,}", line.strip())):
            assert len(scrap) > 2 or scrap.replace(".", "").isdigit() or scrap in whole, (scrap, line)
    for sub in report.subnetworks:
        shown = compact_names(sub.inputs)[:3] + compact_names(sub.outputs)[:3]  # the cells list three
        for word in sub.name.split() + [w for n in shown for w in n.split()]:
            assert any(word in line for line in table), (word, sub.name)
    assert max(len(line) for line in lines) <= 80


def _branchy() -> ConversionReport:
    """A report as a dynamic network produces it: a cond with two branch sub-networks."""
    subs = [
        SubNetwork("Net.forward", 5, ["x"], ["return value"], {"cond": 1, "mm.default": 2}, ["net.py:10"],
                   "1", "Net.forward", ["w"]),
        SubNetwork("then-branch of if at net.py:11", 3, ["x", "hs[0]", "hs[1]", "hs[2]"], ["out", "hs[0]"],
                   {"relu.default": 1, "mm.default": 2}, ["net.py:12"], "1.1", "true_graph_0", ["w"]),
        SubNetwork("else-branch of if at net.py:11", 1, ["x"], ["out", "hs[0]"], {"neg.default": 1},
                   ["net.py:[14]"], "1.2", "false_graph_0"),
    ]
    tree = HostNode("graph", "1 Net.forward (5 ops)", [HostNode("cond", "if at net.py:11", [
        HostNode("graph", "1.1 then-branch of if at net.py:11 (3 ops)"),
        HostNode("graph", "1.2 else-branch of if at net.py:11 (1 ops)")])])
    ops = Counter({"mm.default": 4, "cond": 1, "relu.default": 1, "neg.default": 1})
    return ConversionReport(
        "Net", "forward", "staged", ["x: float32[B, 4]"], "*", 24, 1, 0, subs, tree, ops,
        {"capture_s": 1.5, "lower_s": 0.25, "first_call_s": 0.125},
        warnings=["UserWarning: [careful] something"],
        parity={"cases": 3, "float_outputs": 1, "max_abs_diff": 2.5e-7},
        param_groups=[ParamGroup("(model)", 1, 24)],
    )


@pytest.fixture(scope="module")
def gated() -> ConversionReport:
    torch.manual_seed(0)
    return dycl_jax.to_jax(GatedNet().eval(), (torch.randn(2, 8),)).report()


@pytest.fixture(scope="module")
def shrink() -> ConversionReport:
    torch.manual_seed(0)
    return dycl_jax.to_jax(Shrink().eval(), (torch.randn(2, 6),), host="dispatch").report()


def test_golden_at_80_columns():
    golden("report_branchy_80.txt", render_report(_branchy(), width=80))


def test_render_parts_and_nesting():
    text = render_report(_branchy(), width=80)
    assert "\x1b[" not in text
    lines = text.splitlines()
    cond_line = next(line for line in lines if "if at net.py:11" in line and "branch" not in line)
    branch_line = next(line for line in lines if "1.1 then-branch of if at net.py:11 (3 ops)" in line)
    assert branch_line.index("1.1") > cond_line.index("if at")  # nested under its construct
    assert "hs[0..2]" in text and "state: 1 in w" not in text  # a top-level tensor has no module path
    assert "[careful] something" in text and "2.5e-07" in text
    assert "first call" in text and "0.125" in text
    assert "true_graph_0" not in text and "net.py:[14]" not in text  # the fx name and user lines: --wide only
    wide = render_report(_branchy(), width=200, wide=True)
    assert "true_graph_0" in wide and "net.py:[14]" in wide and "hs[0], hs[1], hs[2]" in wide


def test_histogram_keeps_top_n():
    text = render_report(_branchy(), width=80, top_ops=2)
    assert "mm.default" in text and "… 2 more" in text


def test_compact_names_and_state_summary():
    assert compact_names(["xs[0]", "xs[1]", "xs[2]", "h", "h", "y[1]"]) == ["xs[0..2]", "h×2", "y[1]"]
    assert state_summary(["layers.1.conv1.weight", "layers.1.bn.bias"]) == "2 in layers.1"
    assert state_summary(["conv.weight", "head.bias"]) == "2 in conv, head"


def test_staged_names_are_the_users(gated):
    by_name = {}
    for sub in gated.subnetworks:
        by_name.setdefault(sub.name, sub)
    line_if = 1 + next(i for i, s in enumerate(Path(__file__).with_name("cli_models.py").read_text().splitlines())
                       if "if score.item() > 0.5:" in s)
    then = by_name[f"then-branch of if at cli_models.py:{line_if}"]
    assert then.inputs == ["hidden"] and then.outputs == ["hidden"] and then.graph.startswith("true_graph")
    assert f"else-branch of if at cli_models.py:{line_if}" in by_name
    exit_branch = by_name[f"then-branch of if at cli_models.py:{line_if + 4}"]  # `if hidden.mean() > 3.0: return`
    assert {"return value[0]", "return value[1]", "(returned flag)"} <= set(exit_branch.outputs)
    assert "hidden" in exit_branch.inputs and exit_branch.state == ["head.weight", "head.bias"]
    assert gated.subnetworks[0].outputs == ["return value[0]", "return value[1]"]
    groups = {g.module: g for g in gated.param_groups}
    assert (groups["layers.1.conv1"].params, groups["layers.1.conv1"].values) == (2, 8 * 8 + 8)
    text = render_report(gated, width=80)
    for internal in ("true_graph", "getitem_", "p_layers", "p_m_"):
        assert internal not in text
    assert_legible(text, gated)


def test_dispatch_names_are_the_users(shrink):
    first, second = shrink.subnetworks
    assert first.name.startswith("statements at cli_models.py:") and first.inputs == ["x"]
    assert first.state == ["proj.weight", "proj.bias"] and first.outputs == ["h"]
    assert second.inputs == ["h"] and second.outputs == ["return value"]
    assert [g.module for g in shrink.param_groups] == ["proj"]
    assert_legible(render_report(shrink, width=80), shrink)


def test_json_round_trip(gated, shrink):
    for report in (gated, shrink, _branchy()):
        data = json.loads(json.dumps(report_to_dict(report)))
        back = report_from_dict(data)
        assert back == report
        assert isinstance(back.op_counts, Counter) and isinstance(back.host_tree, HostNode)
        assert render_report(back) == render_report(report)
