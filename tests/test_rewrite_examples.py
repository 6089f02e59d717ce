"""Research-style patterns of examples/dynn, one small model each: export parity on every path."""
from __future__ import annotations

import warnings

import torch

import rewrite_models as M
from dycl_jax.rewrite.api import rewritten, run_torch_trace
from dycl_jax.rewrite.operators import staging
from test_rewrite_capture import check_model

warnings.filterwarnings("ignore", category=FutureWarning)


def _sites(model: torch.nn.Module) -> list[str]:
    with rewritten(model) as record:
        return [s.label for f in record.functions for s in f.sites if not s.static]


def test_continue_with_reshaping_rest_is_one_cond():
    """BlockDrop: the statements after `if ...: continue` move into its else branch."""
    m = M.SkipReshape()
    check_model(m, {M.site("if", "if action.data.sum() == 0:"): {True, False}})
    assert not any(label.startswith("guard@") for label in _sites(m))  # no intermediate join
    with rewritten(m) as record:
        assert "_dycl_ops.data(action)" in record.function("forward").source  # `.data` is traceable


def test_return_in_loop_with_reshaping_features_and_lists():
    """Shallow-Deep: after the return, the feature map is dead (placeholder); the lists
    appended to in a branch are outputs of that branch; np.argmax and list indexing by its
    result stay tensors when staged."""
    m = M.ExitReshape().eval()
    paths = check_model(m, {M.site("if", "if confidence >= self.thr:"): {True, False}})
    assert len(paths) == 3  # exits after each internal classifier, and the fallback
    ep = M.export_rewritten(m, next(iter(paths.values())))
    fallbacks = set()
    for x in M.candidate_inputs():  # every input: the fallback picks different heads
        expected = m(x)
        assert M.same(ep.module()(x), expected)
        assert M.same(run_torch_trace(m, "forward", (x,))[0], expected)
        if not expected[2]:
            fallbacks.add(int(expected[1]))
    assert len(fallbacks) >= 2 and 2 in fallbacks  # an internal classifier and the final one


def test_break_returns_the_index_of_the_iteration_that_broke():
    """MSDNet: x changes width and is dead after the loop; res and i are live."""
    m = M.AnytimeBreak()
    paths = check_model(m, {M.site("if", "if confidence.item() >= self.thresholds[i]:"): {True, False}})
    ep = M.export_rewritten(m.eval(), next(iter(paths.values())))
    exits = set()
    for x in paths.values():
        got = ep.module()(x)
        assert int(got[1]) == m(x)[1]
        exits.add(m(x)[1])
    assert exits == {0, 1, 2}


def test_names_first_assigned_in_a_loop_inside_an_else_branch():
    """PABEE: `logits`/`labels` are assigned only inside the loop of the else branch; the last
    `break` test feeds nothing, and the decomposed graph still makes that decision."""
    m = M.PatienceInElse().eval()
    paths = check_model(m, {M.site("if", "if counter == self.patience:"): {True, False}})
    ep = M.export_rewritten(m, next(iter(paths.values())))
    with staging():  # as the capture stage decomposes: dead control flow is kept
        decomposed = ep.run_decompositions().module()
    site = M.site("if", "if counter == self.patience:")
    breaks = set()
    for decisions, x in paths.items():
        assert M.same(decomposed(x), m(x))
        log: list = []
        M.StagedDecisions(decomposed, log).run(x)
        assert log == list(decisions)
        tests = [v for s, v in decisions if s == site]
        breaks.add(tests.index(True) if True in tests else None)
    assert len(breaks) >= 3  # breaks after different numbers of layers, or never


def test_loop_index_picks_modules_after_a_guarded_break():
    """DeeBERT: `self.ramps[i]` runs under the return flag's guard; i must stay a Python int."""
    m = M.OffRamps()
    paths = check_model(m, {M.site("if", "if mean_entropy(logits) < self.thr[i]:"): {True, False}})
    assert {m.eval()(x)[1] for x in paths.values()} == {1, 2, 3}
