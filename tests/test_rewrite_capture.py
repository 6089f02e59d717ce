"""Capture of rewritten models with torch.export: parity on every path, and decisions."""
from __future__ import annotations

import warnings

import torch

import rewrite_models as M
from dycl_jax.rewrite.api import run_torch_trace

warnings.filterwarnings("ignore", category=FutureWarning)


def check_model(model: torch.nn.Module, expect_sites: dict[str, set]) -> dict[tuple, torch.Tensor]:
    """Export once; on one input per path: exported == eager original, and the staged graph
    makes the decisions the eager trace records. Returns the inputs per path."""
    model.eval()
    inputs = M.paths(model, M.candidate_inputs())
    values = M.site_values(inputs)
    for site, expected in expect_sites.items():  # the inputs cover every path
        assert values.get(site, set()) >= expected, (site, values)
    ep = M.export_rewritten(model, next(iter(inputs.values())))
    exported = ep.module()
    for decisions, x in inputs.items():
        expected = model(x)
        assert M.same(exported(x), expected)
        out, traced = run_torch_trace(model, "forward", (x,))
        assert M.same(out, expected)
        assert M.staged_decisions(ep, x) == list(decisions) == traced
    return inputs


def test_early_exit_in_loop_with_fallback():
    m = M.EarlyExit()
    # `if conf > best_conf` follows an `if` that returns: it becomes that if's `elif`
    inputs = check_model(m, {M.site("elif", "if conf > self.thr:"): {0, 1, 2}})
    exits = {(int(m(x)[1]), bool(m(x)[2])) for x in inputs.values()}
    assert {(0, True), (1, True), (2, True)} <= exits and any(not e for _, e in exits)


def test_per_block_gate_item():
    check_model(M.SkipGate(), {M.site("if", "if g.item() > 0.5:"): {True, False}})


def test_continue_with_python_counter():
    m = M.ContinueSkip()
    inputs = check_model(m, {M.site("if", "if action.sum() == 0:", "skipped = 0"): {True, False}})
    assert len({m(x)[1] for x in inputs.values()}) >= 2  # the counter differs per path


def test_patience_counter_break():
    m = M.Patience()
    inputs = check_model(m, {M.site("if", "if prev is not None"): {True, False}, M.site("if", "if count >= self.patience:"): {True, False}})
    assert len({m(x)[1] for x in inputs.values()}) >= 2  # breaks after different blocks


def test_elif_chain_switch():
    check_model(M.ElifChain(), {M.site("elif", "if s > 0.5:"): {0, 1, 2, 3}})


def test_dynamic_batch_and_decomposition():
    m = M.EarlyExit().eval()
    inputs = list(M.paths(m, M.candidate_inputs(20)).values())
    ep = M.export_rewritten(m, inputs[0], dynamic_batch=True).run_decompositions()
    ops = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any("cond" in o for o in ops)
    for x in inputs + [torch.randn(5, 4) * 3]:
        assert M.same(ep.module()(x), m(x))
