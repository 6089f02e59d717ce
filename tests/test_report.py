"""The conversion report: rendering shows its parts, JSON round-trips it."""
from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

import dycl_jax
from dycl_jax.report.record import ConversionReport, HostNode, SubNetwork, report_from_dict, report_to_dict
from dycl_jax.report.render import render_report


class TwoMatMuls(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(4, 6))
        self.b = torch.nn.Parameter(torch.randn(6, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(torch.mm(x, self.a), self.b)


@pytest.fixture(scope="module")
def converted() -> ConversionReport:
    torch.manual_seed(0)
    return dycl_jax.to_jax(TwoMatMuls().eval(), (torch.randn(3, 4),)).report()


def _branchy() -> ConversionReport:
    """A report as a dynamic network produces it: a cond with two branch sub-networks."""
    subs = [
        SubNetwork("Net.forward", 5, ["p_w", "x"], ["cond_0"], {"cond": 1, "mm.default": 2}, ["net.py:10"]),
        SubNetwork("true_graph_0", 3, ["p_w", "x"], ["relu"], {"relu.default": 1, "mm.default": 2}, ["net.py:12"]),
        SubNetwork("false_graph_0", 1, ["x"], ["neg"], {"neg.default": 1}, ["net.py:[14]"]),
    ]
    tree = HostNode(
        "graph",
        "Net.forward (5 ops)",
        [
            HostNode(
                "cond",
                "cond at net.py:11",
                [HostNode("graph", "true_graph_0 (3 ops)"), HostNode("graph", "false_graph_0 (1 ops)")],
            )
        ],
    )
    ops = Counter({"mm.default": 4, "cond": 1, "relu.default": 1, "neg.default": 1})
    return ConversionReport(
        "Net", "forward", "staged", ["x: float32[B, 4]"], "*", 24, 1, 0, subs, tree, ops,
        {"capture_s": 1.5, "lower_s": 0.25, "first_call_s": 0.125},
        warnings=["UserWarning: [careful] something"],
        parity={"cases": 3, "float_outputs": 1, "max_abs_diff": 2.5e-7},
    )


def test_render_shows_subnetworks_and_tree():
    text = render_report(_branchy(), width=140)
    for name in ("Net.forward", "true_graph_0", "false_graph_0"):
        assert name in text
    assert "sub-networks" in text and "host control flow" in text
    # the tree nests both branches under the cond line: they sit deeper (further right)
    lines = text.splitlines()
    cond_line = next(line for line in lines if "cond at net.py:11" in line)
    branch_line = next(line for line in lines if "true_graph_0 (3 ops)" in line)
    assert branch_line.index("true_graph_0") > cond_line.index("cond at")
    assert "net.py:[14]" in text  # brackets in data are shown, not read as markup
    assert "[careful] something" in text
    assert "2.5e-07" in text
    assert "first call" in text and "0.125" in text


def test_render_histogram_keeps_top_n():
    text = render_report(_branchy(), width=140, top_ops=2)
    assert "mm.default" in text and "… 2 more" in text


def test_render_has_no_colour_codes_and_respects_width():
    text = render_report(_branchy(), width=90)
    assert "\x1b[" not in text
    assert max(len(line) for line in text.splitlines()) <= 90


def test_render_of_a_real_conversion(converted):
    text = render_report(converted)
    assert "TwoMatMuls.forward" in text
    assert f"{4 * 6 + 6 * 2:,} values in 2 arrays" in text
    assert "mm.default" in text and "test_report.py:" in text  # the user line of the mm calls


def test_json_round_trip(converted):
    for report in (converted, _branchy()):
        data = json.loads(json.dumps(report_to_dict(report)))
        back = report_from_dict(data)
        assert back == report
        assert isinstance(back.op_counts, Counter) and isinstance(back.host_tree, HostNode)
        assert render_report(back) == render_report(report)
