"""Dynamic example models, staged as one XLA program, agree with torch on every path."""
from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from dycl_jax.rewrite.api import run_torch_trace
from examples.dynn import MODELS, load
from converted import default as _converted  # the default (auto) must pick the staged host here
from differential import assert_same  # pytest puts tests/ on sys.path
from gradient_parity import assert_gradients_match, one_per_path

N_INPUTS = 50
REWRITTEN_EVERY = 5


@pytest.mark.parametrize("name", MODELS)
def test_staged_matches_torch_on_every_path(name: str) -> None:
    mod = load(name)
    model, jm = _converted(name)
    assert jm.host == "staged"
    paths: set = set()
    seen: dict[str, set] = defaultdict(set)
    inputs, labels = mod.inputs(N_INPUTS), []
    for k, args in enumerate(inputs):
        with torch.no_grad():
            original = model(*args)
        labels.append(mod.path_of(model, args))
        got, jax_decisions = jm.trace(*args)
        # jm(...) is the program users call, a separate compilation from jm.trace: both are checked
        assert_same(original, jm(*args), f"{name} input {k} (jm(...) vs original torch)")
        assert_same(original, got, f"{name} input {k} (jm.trace vs original torch)")
        # the rewritten torch program (about 0.2 s a call: it dry-runs every branch) on the first
        # input of each path and every REWRITTEN_EVERY-th input: its decisions name each site
        if k % REWRITTEN_EVERY == 0 or not set(labels[-1]) <= paths:
            rewritten_out, torch_decisions = run_torch_trace(model, "forward", args)
            assert_same(original, rewritten_out, f"{name} input {k} (rewritten torch vs original)")
            assert jax_decisions == torch_decisions, f"{name} input {k}: decisions differ"
        paths.update(labels[-1])
        for site, value in jax_decisions:
            seen[site].add(value)
    assert paths == set(mod.PATHS), f"paths never taken: {set(mod.PATHS) - paths}"
    assert seen, "the staged program made no data-dependent decision"
    for site, values in seen.items():  # branch coverage: every two-way decision went both ways
        if not site.startswith("elif@"):
            assert values == {True, False}, f"{site} only ever took {values}"
    if name != "act":  # fine-tuning gradients through lax.cond (act's fori_loop: test_loop_bounds.py)
        assert_gradients_match(model, jm, one_per_path(mod, model, inputs, labels), name)


@pytest.mark.parametrize("name", ["shallow_deep", "act"])
def test_report_lists_host_control_flow(name: str) -> None:
    _, jm = _converted(name)
    report = jm.report()
    kinds = set()

    def walk(node) -> None:
        kinds.add(node.kind)
        for child in node.children:
            walk(child)

    walk(report.host_tree)
    assert kinds & {"cond", "while_loop"}, kinds
    assert len(report.subnetworks) >= 3
    assert any(sub.source_lines for sub in report.subnetworks)
