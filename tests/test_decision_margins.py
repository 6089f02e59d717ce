"""Decision margins in `jm.trace` (staged and dispatch), and the parity check telling a flip of a
near-threshold decision (float rounding) apart from a real mismatch."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import dycl_jax
from dycl_jax.report.parity import FLOAT_ERROR_FLOOR, parity
from dycl_jax.report.record import report_from_dict, report_to_dict
from dycl_jax.report.render import render_report
from dycl_jax.rewrite.api import run_torch_trace

HOSTS = ["staged", "dispatch"]


class Confident(nn.Module):
    """An early exit on a confidence threshold, research style: `.item()` reduced in Python."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        conf = (x * self.scale).sum()
        if conf >= 0.9:
            return self.head(x) * 2.0, torch.tensor(1)
        h = torch.relu(x) - 0.25
        if (h > 0).sum() > 2 or h.mean() < -1.0:
            return self.head(h * 3.0), torch.tensor(2)
        return self.head(h), torch.tensor(0)


def _model():
    torch.manual_seed(0)
    return Confident().eval()


def _row(values):
    return (torch.tensor([values], dtype=torch.float32),)


@pytest.mark.parametrize("host", HOSTS)
def test_trace_records_each_predicates_distance_from_its_threshold(host):
    model = _model()
    jm = dycl_jax.to_jax(model, _row([0.1, 0.2, 0.3, 0.4]), host=host)
    exact = _row([0.9, 0.0, 0.0, 0.0])  # conf is 0.9 exactly: the test holds with no room
    _, dec = jm.trace(*exact)
    assert dec == [(dec[0][0], True)] and dec[0].margin == 0.0
    near = np.float32(0.9) - np.float32(6e-8)  # one float32 ulp below the threshold
    _, dec = jm.trace(*_row([float(near), 0.0, 0.0, 0.0]))
    assert [v for _, v in dec][0] is False
    assert dec[0].margin == pytest.approx(float(np.float32(0.9) - near), rel=1e-3) and dec[0].margin < 1e-7
    x = _row([0.5, -0.1, 0.7, -2.0])  # conf -0.9: far from the threshold; then the or-test
    out, dec = jm.trace(*x)
    assert dec[0].margin == pytest.approx(1.8, rel=1e-5)
    h = torch.relu(x[0]) - 0.25
    # `(h > 0).sum() > 2 or h.mean() < -1.0`: the count 2 is one step from passing 2, its
    # elements are 0.25 and more from 0, the mean 1.04 above -1: the closest is 0.25
    assert dec[1].margin == pytest.approx(0.25, rel=1e-5)
    want_out, want = run_torch_trace(model, "forward", x)
    assert [tuple(d) for d in dec] == [tuple(d) for d in want]  # the pairs callers compare, as before
    assert h.gt(0).sum().item() == 2


def test_margins_of_a_loop_test_and_an_elif_chain():
    class Loop(nn.Module):
        def forward(self, x):
            n = torch.zeros((), dtype=torch.long)
            while x.sum() < 3.0 and n < 5:
                x = x + 0.5
                n = n + 1
            if x.max() > 2.5:
                y = x * 2
            elif x.min() < 0.0:
                y = x - 1
            else:
                y = x
            return y, n

    x = (torch.tensor([0.2, 0.3]),)
    jm = dycl_jax.to_jax(Loop(), x, host="staged")
    _, dec = jm.trace(*x)
    _, want = run_torch_trace(Loop(), "forward", x)
    assert dec == want
    # sums 0.5, 1.5, 2.5, 3.5 against 3.0 (the counter is 2 or more steps from 5)
    assert [round(d.margin, 5) for d in dec[:4]] == [2.5, 1.5, 0.5, 0.5]
    # x ends at [1.7, 1.8]; the chain's path index: max 1.8 vs 2.5 and min 1.7 vs 0.0 decide it
    assert dec[4][1] == 2 and dec[4].margin == pytest.approx(0.7, rel=1e-5)


@pytest.mark.parametrize("host", HOSTS)
def test_parity_tells_a_near_threshold_flip_from_a_real_mismatch(host):
    cases = [_row([0.9, 0.0, 0.0, 0.0]), _row([0.7, 0.0, 0.0, 0.0]), _row([2.0, 1.0, 0.0, 0.0]),
             _row([-1.0, 0.5, 0.25, 0.1])]
    model = _model()
    jm = dycl_jax.to_jax(model, cases[0], host=host)
    # torch's arithmetic one rounding away from XLA's: the scale it multiplies by is 1 - 1.2e-7
    with torch.no_grad():
        model.scale.copy_(torch.tensor(1.0) - 1.2e-7)
    stats, problems, flips = parity(model, "forward", jm, cases)
    assert not problems
    assert stats["decision_flips"] == 1 and stats["mismatches"] == 0, flips
    assert flips[0].case == 0 and flips[0].near_threshold and flips[0].margin <= stats["float_error"]
    assert stats["float_error"] == FLOAT_ERROR_FLOOR
    if host == "staged":  # torch's decisions are known: the flipped one is named
        assert (flips[0].torch_value, flips[0].jax_value) == ("False", "True")
    # a deliberately perturbed state: torch now decides otherwise where the margin is 0.2
    with torch.no_grad():
        model.scale.copy_(torch.tensor(1.5))
    stats, _, flips = parity(model, "forward", jm, cases)
    by_case = {f.case: f for f in flips}
    assert not by_case[1].near_threshold and by_case[1].margin == pytest.approx(0.2, rel=1e-5)
    assert stats["mismatches"] >= 1
    text = render_report(_report(jm, stats, flips), width=200)
    assert "MISMATCH" in text and "real mismatches" in text


def test_a_flip_is_reported_as_float_rounding_and_survives_json():
    cases = [_row([0.9, 0.0, 0.0, 0.0]), _row([2.0, 1.0, 0.0, 0.0])]
    model = _model()
    jm = dycl_jax.to_jax(model, cases[0], host="staged")
    with torch.no_grad():
        model.scale.copy_(torch.tensor(1.0) - 1.2e-7)
    stats, _, flips = parity(model, "forward", jm, cases)
    report = _report(jm, stats, flips)
    text = render_report(report, width=200)
    assert "near-threshold flip" in text and "MISMATCH" not in text
    again = report_from_dict(report_to_dict(report))
    assert again.flips == report.flips and again.parity["decision_flips"] == 1


def test_same_decisions_different_values_is_a_mismatch():
    cases = [_row([2.0, 1.0, 0.0, 0.0]), _row([3.0, 1.0, 0.0, 0.0])]
    model = _model()
    jm = dycl_jax.to_jax(model, cases[0], host="staged")
    with torch.no_grad():
        model.head.bias.add_(0.01)
    stats, _, flips = parity(model, "forward", jm, cases)
    assert stats["mismatches"] == 2 and all(f.site == "" and not f.near_threshold for f in flips)


def _report(jm, stats, flips):
    report = jm.report()
    report.parity, report.flips = stats, flips
    return report
