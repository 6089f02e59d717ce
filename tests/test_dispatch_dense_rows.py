"""Row selections inside a dispatch-host island take the staged host's dense form (every row
computed, the selected ones kept) where the proof holds and its contraction work is within the
host's budget: the MoE layer is then one program per forward instead of a program and a size
read per expert. Past the budget, or where the rows mix, the island's host version runs each
selection with its exact row count. Every case against the ORIGINAL torch model on every path."""
from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch

import dycl_jax
from dycl_jax.host import dispatch
from examples.dynn import moe
from test_bounded_rows import IndexAddStyle, MaskStyle, _inputs, _matches_on_every_path, _model

SELECTION_LINE = next(i for i, text in enumerate(open(moe.__file__), 1) if ".nonzero(as_tuple=True)[0]" in text)


# the MoE example's dense form: 12 tokens through four experts of hidden widths 8/16/32/64, two
# 16-wide matrix products each
WORK = 12 * 2 * (2 * 16 * (8 + 16 + 32 + 64))


def _budget(flops: float):
    """The dispatch host's budget for the dense form set to `flops` while the block runs."""
    return mock.patch.object(dispatch, "dense_rows_budget", lambda: flops)


def _graph_ops(jm) -> set[str]:
    """Every ATen op of every program the dispatch host has compiled so far."""
    return {str(step.node.target) for g in jm._fn.graphs.values() for step in g.steps}


def _island_reasons(jm) -> list[str]:
    """Why islands run their host version: for good (`host_reason`), or at the signatures whose
    dense form is over the budget (`over_budget`)."""
    return [reason for st in jm._fn.regions.values() if st.spec.kind == "island"
            for part in st.parts for reason in (part.host_reason, part.over_budget) if reason is not None]


# (the other written forms of test_bounded_rows take the same converter and proof: the staged
# host's tests run them all; here the three that differ most: nonzero, a boolean mask, index_add_)
@pytest.mark.parametrize("layer", [None, MaskStyle, IndexAddStyle], ids=["moe", "mask_style", "index_add"])
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
    if layer is None:
        assert report.bounded_rows == [f"moe.py:{SELECTION_LINE}: sel = (expert_idx == e).nonzero(as_tuple=True)[0]"]
    captures = host.captures
    _matches_on_every_path(model, jm, _inputs(True))  # a second pass compiles nothing
    assert host.captures == captures


def test_over_the_budget_each_expert_runs_on_its_exact_rows() -> None:
    """With no budget for the dense form (what experts too large to run on every token get), the
    island's host version runs: per expert a `nonzero` on the host and the expert on its rows."""
    model, args = _model(None)
    with _budget(0.0):
        jm = dycl_jax.to_jax(model, args, host="dispatch")
        _matches_on_every_path(model, jm, _inputs(True))
    reasons = _island_reasons(jm)
    assert reasons and all("budget of the dense form" in r and "MFLOP" in r for r in reasons), reasons
    assert "aten.index_put.default" in _graph_ops(jm)
    dense = dycl_jax.to_jax(model, args, host="dispatch")  # the two dispatch forms agree with each other too
    for k, (x,) in enumerate(_inputs(True)):
        torch.testing.assert_close(torch.tensor(np.asarray(dense(x))), torch.tensor(np.asarray(jm(x))),
                                   rtol=1e-5, atol=1e-5, msg=f"dense vs exact, input {k}")
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
    model, args = _model(None)
    for budget, dense in ((WORK - 1.0, False), (float(WORK), True)):
        with _budget(budget):
            jm = dycl_jax.to_jax(model, args, host="dispatch")
        assert bool(jm.report().bounded_rows) is dense, budget
        assert (_island_reasons(jm) == []) is dense


def test_a_signature_over_the_budget_leaves_the_others_dense() -> None:
    """The budget is per signature: 24 tokens (twice the work) run the island's host version,
    while the 12-token signature keeps its one dense program, before and after."""
    model, args = _model(None)
    g = torch.Generator().manual_seed(3)
    longer = [(torch.randn(1, 24, 16, generator=g) * s,) for s in (0.5, 1.0, 2.0)]
    with _budget(WORK * 1.5):
        jm = dycl_jax.to_jax(model, args, host="dispatch")
        _matches_on_every_path(model, jm, _inputs(True))
        for k, (x,) in enumerate(longer):
            with torch.no_grad():
                want = model(x)
            torch.testing.assert_close(torch.tensor(jm(x).__array__()), want, rtol=1e-4, atol=1e-4,
                                       msg=f"24 tokens, input {k}")
        host = jm._fn
        captures = host.captures
        _matches_on_every_path(model, jm, _inputs(True))  # 12 tokens: still the dense program
        assert host.captures == captures
    parts = [p for st in host.regions.values() if st.spec.kind == "island" for p in st.parts]
    assert any(p.over_budget and dispatch.OVER_BUDGET in p.cache.values() for p in parts)
    assert all(p.host_reason is None for p in parts)
    assert any(type(e) is dispatch.Compiled for p in parts for e in p.cache.values())
    assert jm.report().bounded_rows  # the dense selection of the 12-token program


def test_both_sides_of_the_budget_export_and_the_emitted_module_refuses(tmp_path) -> None:
    """A host whose island ran densely at 12 tokens and as its host version at 24: the exported
    artifact serves both (program, host version), against torch; the emitted module, which holds
    one class per submodule, refuses with a located error instead of a module that fails."""
    model, args = _model(None)
    g = torch.Generator().manual_seed(4)
    cases = [(torch.randn(1, 24, 16, generator=g),), *_inputs(True)]
    with _budget(WORK * 1.5):
        jm = dycl_jax.to_jax(model, args, host="dispatch")
        for case in cases:
            jm(*case)
    jm.export(str(tmp_path / "artifact"))
    loaded = dycl_jax.load(str(tmp_path / "artifact"))
    for k, (x,) in enumerate(cases):
        with torch.no_grad():
            want = model(x)
        torch.testing.assert_close(torch.tensor(np.asarray(loaded(x.numpy()))), want, rtol=1e-4, atol=1e-4,
                                   msg=f"input {k} ({x.shape[1]} tokens)")
    with pytest.raises(dycl_jax.DyclError, match="one form per submodule") as info:
        jm.emit(str(tmp_path / "emitted"))
    assert info.value.location is not None and info.value.location.file == moe.__file__
