"""Row selections inside a dispatch-host island take the staged host's dense form (every row
computed, the selected ones kept) where the proof holds and its contraction work is within the
host's budget: the MoE layer is then one program per forward instead of a program and a size
read per expert. Past the budget, or where the rows mix, the island's host version runs each
selection with its exact row count. Every case against the ORIGINAL torch model on every path."""
from __future__ import annotations

from unittest import mock

import pytest
import torch

import dycl_jax
from dycl_jax.host import dispatch
from examples.dynn import moe
from test_bounded_rows import (AccumulateStyle, IndexAddStyle, MaskStyle, MixesRows, WhereStyle, _inputs,
                               _matches_on_every_path, _model)

SELECTION_LINE = next(i for i, text in enumerate(open(moe.__file__), 1) if ".nonzero(as_tuple=True)[0]" in text)


def _graph_ops(jm) -> set[str]:
    """Every ATen op of every program the dispatch host has compiled so far."""
    return {str(step.node.target) for g in jm._fn.graphs.values() for step in g.steps}


def _island_reasons(jm) -> list[str]:
    return [part.host_reason for st in jm._fn.regions.values() if st.spec.kind == "island"
            for part in st.parts if part.host_reason is not None]


@pytest.mark.parametrize("layer", [None, MaskStyle, WhereStyle, AccumulateStyle, IndexAddStyle],
                         ids=["moe", "mask_style", "where_style", "accumulate", "index_add"])
def test_selections_in_a_dispatch_island_run_densely_in_one_program(layer) -> None:
    model, args = _model(layer)
    jm = dycl_jax.to_jax(model, args, host="dispatch")
    _matches_on_every_path(model, jm, _inputs(False))
    host = jm._fn
    ops = _graph_ops(jm)
    assert not any("nonzero" in o or "index_put" in o or "dycl." in o for o in ops), ops
    assert host.sites_read == set() and _island_reasons(jm) == []
    report = jm.report()
    assert report.host_statements == [] and len(report.subnetworks) == 1, report.subnetworks
    assert [b.split(": ")[0] for b in report.bounded_rows] and all(b.startswith(("moe.py:", "test_bounded_rows.py:"))
                                                                   for b in report.bounded_rows)
    captures = host.captures
    _matches_on_every_path(model, jm, _inputs(False))  # a second pass compiles nothing
    assert host.captures == captures


def test_moe_report_names_the_dense_selection() -> None:
    model, args = _model(None)
    report = dycl_jax.to_jax(model, args, host="dispatch").report()
    assert report.bounded_rows == [f"moe.py:{SELECTION_LINE}: sel = (expert_idx == e).nonzero(as_tuple=True)[0]"]


def test_over_the_budget_each_expert_runs_on_its_exact_rows() -> None:
    """With no budget for the dense form (what experts too large to run on every token get), the
    island's host version runs: per expert a `nonzero` on the host and the expert on its rows."""
    model, args = _model(None)
    with mock.patch.dict(dispatch.DENSE_ROWS_FLOPS, {"cpu": 0.0}), \
            mock.patch.object(dispatch, "DENSE_ROWS_FLOPS_ACCELERATOR", 0.0):
        jm = dycl_jax.to_jax(model, args, host="dispatch")
        _matches_on_every_path(model, jm, _inputs(False))
    reasons = _island_reasons(jm)
    assert reasons and all("budget of the dense form" in r and "MFLOP" in r for r in reasons), reasons
    assert "aten.index_put.default" in _graph_ops(jm)
    report = jm.report()
    assert report.bounded_rows == [] and any("nonzero" in s for s in report.host_statements)
    # the host tree says why the island runs its host version
    labels = []
    stack = [report.host_tree]
    while stack:
        node = stack.pop()
        labels.append(node.label)
        stack.extend(node.children)
    assert any(label.startswith("did not stage") and "budget of the dense form" in label for label in labels), labels


def test_the_budget_is_the_contraction_work_of_the_selected_computation() -> None:
    """The MoE example's dense form: 12 tokens through four experts of hidden widths 8/16/32/64
    (two 16-wide matrix products each): 12 * 2 * (2 * 16 * 120) = 92,160 FLOPs. A budget just
    under it refuses the dense form, one at it keeps it."""
    work = 12 * 2 * (2 * 16 * (8 + 16 + 32 + 64))
    model, args = _model(None)
    for budget, dense in ((work - 1.0, False), (float(work), True)):
        with mock.patch.dict(dispatch.DENSE_ROWS_FLOPS, {"cpu": budget}), \
                mock.patch.object(dispatch, "DENSE_ROWS_FLOPS_ACCELERATOR", budget):
            jm = dycl_jax.to_jax(model, args, host="dispatch")
        assert bool(jm.report().bounded_rows) is dense, budget
        assert (_island_reasons(jm) == []) is dense


def test_rows_that_mix_keep_their_exact_count_in_the_dispatch_island() -> None:
    """A computation that sums over the selected rows is not row-wise: the proof refuses the dense
    form inside the island, whose host version runs the selection exactly."""
    model, args = _model(MixesRows)
    jm = dycl_jax.to_jax(model, args, host="dispatch")
    _matches_on_every_path(model, jm, _inputs(True))
    assert jm.report().bounded_rows == []
    assert any("not proved row-wise" in r for r in _island_reasons(jm)), _island_reasons(jm)


def test_dense_and_exact_dispatch_agree_with_staged_on_every_input() -> None:
    """Three conversions of one model, each against torch and against each other."""
    model, args = _model(None)
    staged = dycl_jax.to_jax(model, args, host="staged")
    dense = dycl_jax.to_jax(model, args, host="dispatch")
    with mock.patch.dict(dispatch.DENSE_ROWS_FLOPS, {"cpu": 0.0}), \
            mock.patch.object(dispatch, "DENSE_ROWS_FLOPS_ACCELERATOR", 0.0):
        exact = dycl_jax.to_jax(model, args, host="dispatch")
        for k, (x,) in enumerate(_inputs(True)):
            with torch.no_grad():
                want = model(x).numpy()
            outs = [jm(x) for jm in (staged, dense, exact)]
            got = {name: torch.tensor(out.__array__()) for name, out in zip(("staged", "dense", "exact"), outs)}
            for name, value in got.items():
                torch.testing.assert_close(value, torch.as_tensor(want), rtol=1e-4, atol=1e-4,
                                           msg=f"{name} input {k}")
            torch.testing.assert_close(got["dense"], got["exact"], rtol=1e-5, atol=1e-5, msg=f"dense vs exact {k}")
