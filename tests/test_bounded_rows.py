"""Bounded row selections (rewrite/rows.py, capture/bounded_rows.py): the MoE `nonzero` gather,
compute and scatter stages as one XLA program equal to the ORIGINAL torch model on every path;
a computation that mixes the selected rows, or indices that may repeat, never takes that form."""
from __future__ import annotations

from functools import lru_cache

import pytest
import torch

import dycl_jax
from dycl_jax.errors import DyclError
from dycl_jax.report.record import report_from_dict, report_to_dict
from dycl_jax.report.render import render_report
from dycl_jax.rewrite import rows
from examples.dynn import moe
from differential import assert_same  # pytest puts tests/ on sys.path
from gradient_parity import assert_gradients_match, fewest_covering

N_INPUTS = 40  # floats within assert_same's 1e-4 of torch; ints and bools exactly


class MaskStyle(moe.SwitchLayer):
    """Boolean-mask indexing and assignment, with a tensor test for an empty expert."""

    def forward(self, tokens):
        probs = torch.softmax(self.gate(tokens), dim=-1)
        w, expert_idx = probs.max(-1)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            mask = expert_idx == e
            if mask.any():
                out[mask] = expert(tokens[mask]) * w[mask, None]
        return out


class WhereStyle(moe.SwitchLayer):
    """`torch.where(mask)[0]`, `len(sel) == 0`, an index with a slice after the selection."""

    def forward(self, tokens):
        probs = torch.softmax(self.gate(tokens), dim=-1)
        w, expert_idx = probs.max(-1)
        out = tokens.new_zeros(tokens.shape)
        for e, expert in enumerate(self.experts):
            sel = torch.where(expert_idx == e)[0]
            if len(sel) == 0:
                continue
            out[sel] = expert(tokens[sel, :]) * w.unsqueeze(-1)[sel]
        return out


class _Routed(moe.SwitchLayer):
    def route(self, tokens):
        """moe's top-1 routing: each token's gate value and expert."""
        return torch.softmax(self.gate(tokens), dim=-1).max(-1)


class AccumulateStyle(_Routed):
    """`out[sel] += ...` inside `if sel.numel() > 0:` (the writes in the body, no `continue`)."""

    def forward(self, tokens):
        w, expert_idx = self.route(tokens)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            sel = (expert_idx == e).nonzero(as_tuple=True)[0]
            if sel.numel() > 0:
                out[sel] += expert(tokens[sel]) * w[sel, None]
        return out


class IndexAddStyle(_Routed):
    """`out.index_add_(0, sel, ...)` under `if len(sel):`."""

    def forward(self, tokens):
        w, expert_idx = self.route(tokens)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            sel = torch.nonzero(expert_idx == e, as_tuple=True)[0]
            if len(sel):
                out.index_add_(0, sel, expert(tokens[sel]) * w[sel].unsqueeze(1))
        return out


class ShapeGuardStyle(_Routed):
    """`if sel.shape[0] != 0:` around an assignment, and a second `-=` write of the same rows."""

    def forward(self, tokens):
        w, expert_idx = self.route(tokens)
        out = tokens.clone()
        for e, expert in enumerate(self.experts):
            sel = torch.where(expert_idx == e)[0]
            if sel.shape[0] != 0:
                out[sel] = expert(tokens[sel]) * w[sel, None]
                out[sel] -= 0.5 * tokens[sel]
        return out


class Top1Router(moe.SwitchLayer):
    """A top-1 router as research code writes it: a boolean mask per expert, `if mask.any():`,
    the gate value broadcast over the features, accumulated into the output."""

    def forward(self, tokens):
        scores = self.gate(tokens).softmax(dim=-1)
        gate, idx = torch.max(scores, dim=1)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            mask = idx == e
            if mask.any():
                out[mask] += expert(tokens[mask]) * gate[mask, None]
        return out


class BareMaskStyle(_Routed):
    """`out[mask] = expert(tokens[mask])` with no emptiness test at all (torch runs the expert
    on zero rows) in a function with no other tensor-decided construct."""

    def forward(self, tokens):
        w, expert_idx = self.route(tokens)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            mask = expert_idx == e
            out[mask] = expert(tokens[mask]) * w[mask].unsqueeze(-1)
        return out


class MixesRows(moe.SwitchLayer):
    """Each expert's output is centred on the mean over its own tokens: it mixes the selected rows."""

    def forward(self, tokens):
        probs = torch.softmax(self.gate(tokens), dim=-1)
        w, expert_idx = probs.max(-1)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            sel = (expert_idx == e).nonzero(as_tuple=True)[0]
            if sel.numel() == 0:
                continue
            out[sel] = (expert(tokens[sel]) - expert(tokens[sel]).mean(0)) * w[sel, None]
        return out


class SumsRows(moe.SwitchLayer):
    """`tokens[sel].sum(0)` inside the written value: a reduction over the selected rows."""

    def forward(self, tokens):
        probs = torch.softmax(self.gate(tokens), dim=-1)
        w, expert_idx = probs.max(-1)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            sel = (expert_idx == e).nonzero(as_tuple=True)[0]
            if sel.numel() == 0:
                continue
            out[sel] = expert(tokens[sel]) * w[sel, None] + tokens[sel].sum(0)
        return out


class RepeatedRows(moe.SwitchLayer):
    """Top-2 routing: `nonzero` of a 2-D mask gives a token's row once per chosen slot."""

    def forward(self, tokens):
        probs = torch.softmax(self.gate(tokens), dim=-1)
        w, top = probs.topk(2, dim=-1)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            sel = (top == e).nonzero(as_tuple=True)[0]
            if sel.numel() == 0:
                continue
            out[sel] = expert(tokens[sel]) * w[sel, 0, None]
        return out


class RepeatedIndexAdd(moe.SwitchLayer):
    """`nonzero` of a 2-D mask repeats a token's row once per expert over the threshold, and
    `index_add_` adds every repeat: accumulating writes equal a masked dense form only for
    distinct rows, so this one must keep its exact indices."""

    def forward(self, tokens):
        probs = torch.softmax(self.gate(tokens), dim=-1)
        out = torch.zeros_like(tokens)
        sel = (probs > 0.2).nonzero(as_tuple=True)[0]
        out.index_add_(0, sel, self.experts[0](tokens[sel]))
        return out


class WholeTensorWrite(_Routed):
    """Writes a value with all N rows (not computed from the selected ones) into the selected
    rows: torch accepts it only when every row is selected, so no dense form may take it."""

    def forward(self, tokens):
        w, expert_idx = self.route(tokens)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            sel = (expert_idx == e).nonzero(as_tuple=True)[0]
            if sel.numel() == 0:
                continue
            out[sel] = expert(tokens) * w[:, None]
        return out


def _model(layer: type | None):
    model, args = moe.example()
    if layer is not None:
        model.moe.__class__ = layer  # same weights, the forward written another way
    return model, args


@lru_cache(maxsize=None)
def _inputs(covering: bool) -> tuple:
    xs = moe.inputs(N_INPUTS)
    return tuple(fewest_covering(moe, _model(None)[0], xs) if covering else xs)


def _matches_on_every_path(model, jm, inputs) -> None:
    routing = _model(None)[0]  # every layer here routes as moe's (an expert may run on zero rows)
    paths = set()
    for k, args in enumerate(inputs):
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*args), f"input {k}")
        paths.update(moe.path_of(routing, args))
    assert paths == set(moe.PATHS), set(moe.PATHS) - paths


def _one_staged_program(jm) -> None:
    assert jm.host == "staged"
    graph = jm._emit_input.ep.graph_module.graph
    ops = {str(n.target) for n in graph.nodes if n.op == "call_function"}
    assert not any("nonzero" in o or "dycl." in o or "index_put" in o for o in ops), ops


@pytest.mark.parametrize("host", ["staged", "auto"])
@pytest.mark.parametrize("layer", [None, MaskStyle, WhereStyle], ids=["moe", "mask_style", "where_style"])
def test_bounded_form_is_one_staged_program_equal_to_torch(host, layer) -> None:
    model, args = _model(layer)
    jm = dycl_jax.to_jax(model, args, host=host)
    _one_staged_program(jm)
    _matches_on_every_path(model, jm, _inputs(False))


@pytest.mark.parametrize("layer", [AccumulateStyle, IndexAddStyle, ShapeGuardStyle, Top1Router, BareMaskStyle])
def test_more_written_forms_stage_equal_to_torch(layer) -> None:
    """`+=`/`-=`, `index_add_`, a nonempty test around the writes instead of `continue`, and a
    boolean-mask top-1 router: one staged program, equal to torch on every path (every expert
    empty in some input, all used in others)."""
    model, args = _model(layer)
    jm = dycl_jax.to_jax(model, args, host="staged")
    _one_staged_program(jm)
    _matches_on_every_path(model, jm, _inputs(False))


@pytest.mark.parametrize("layer", [MixesRows, SumsRows, RepeatedRows])
def test_rows_mixed_or_repeated_refuse_the_bounded_form(layer) -> None:
    model, args = _model(layer)
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(model, args, host="staged")
    err = info.value
    assert err.location is not None and err.location.file == __file__, err
    assert 'host="auto"' in (err.fix or "") and 'host="dispatch"' in (err.fix or "")


def test_repeated_rows_accumulate_on_the_dispatch_host_equal_to_torch() -> None:
    model, args = _model(RepeatedIndexAdd)
    jm = dycl_jax.to_jax(model, args)
    assert jm.host == "dispatch"
    xs = _inputs(True)
    assert any(((torch.softmax(model.moe.gate(model.norm(x.reshape(-1, 16))), -1) > 0.2).sum(-1) > 1).any()
               for (x,) in xs), "no input repeats a row"
    _matches_on_every_path(model, jm, xs)


def test_a_value_with_the_masks_rows_not_from_the_selection_is_refused() -> None:
    model, args = _model(WholeTensorWrite)
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(model, args, host="staged")
    assert info.value.location is not None and info.value.location.file == __file__, info.value


def test_rows_mixed_run_on_the_dispatch_host_equal_to_torch() -> None:
    model, args = _model(MixesRows)
    jm = dycl_jax.to_jax(model, args)
    assert jm.host == "dispatch"
    assert "test_bounded_rows.py:" in jm.report().dispatch_reason
    _matches_on_every_path(model, jm, _inputs(True))
    # inside the dispatch host's island too, the proof refuses the dense form (its host version
    # runs the selection exactly: tests/test_dispatch_dense_rows.py)
    assert jm.report().bounded_rows == []
    reasons = [p.host_reason for st in jm._fn.regions.values() if st.spec.kind == "island" for p in st.parts]
    assert any(r and "not proved row-wise" in r for r in reasons), reasons


def test_report_names_each_bounded_selection_with_file_and_line() -> None:
    """The report's data (a field) says which statements staged through the bounded form;
    rich renders it; a round trip through JSON keeps it; the dispatch host lists the selections its
    islands compute densely (tests/test_dispatch_dense_rows.py), here the same one."""
    model, args = _model(None)
    report = dycl_jax.to_jax(model, args, host="staged").report()
    line = next(i for i, text in enumerate(open(moe.__file__), 1) if ".nonzero(as_tuple=True)[0]" in text)
    assert report.bounded_rows == [f"moe.py:{line}: sel = (expert_idx == e).nonzero(as_tuple=True)[0]"]
    text = render_report(report, width=200)
    assert "bounded rows" in text and f"moe.py:{line}" in text
    assert report_from_dict(report_to_dict(report)).bounded_rows == report.bounded_rows
    masked = dycl_jax.to_jax(*_model(Top1Router), host="staged").report()  # a mask: the write's line
    assert [b.split(": ")[0] for b in masked.bounded_rows] == [f"test_bounded_rows.py:{_line_of(Top1Router, '+=')}"]
    assert dycl_jax.to_jax(model, args, host="dispatch").report().bounded_rows == report.bounded_rows


def _line_of(cls: type, needle: str) -> int:
    import inspect
    lines, start = inspect.getsourcelines(cls)
    return start + next(i for i, text in enumerate(lines) if needle in text)


def test_two_conversions_in_one_process_keep_their_own_selections() -> None:
    """The selections' locations belong to one capture: a second conversion reports (and a
    refusal names) only its own, and nothing stays recorded once a conversion ends."""
    first = dycl_jax.to_jax(*_model(WhereStyle), host="staged").report().bounded_rows
    assert [b.split(": ")[0] for b in first] == [f"test_bounded_rows.py:{_line_of(WhereStyle, 'torch.where(expert_idx')}"]
    second = dycl_jax.to_jax(*_model(AccumulateStyle), host="staged").report().bounded_rows
    assert [b.split(": ")[0] for b in second] == [f"test_bounded_rows.py:{_line_of(AccumulateStyle, '.nonzero(')}"]
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(*_model(SumsRows), host="staged")
    assert info.value.location.line == _line_of(SumsRows, ".nonzero(")
    assert rows._DENSE.get() is None and all(rows.location(u) is None for u in range(next(rows._UIDS)))


class LogOfPositive(torch.nn.Module):
    """Two selections into one output; the first expert takes a log that is finite only on the
    rows the router gives it (feature 0 > 0). torch never computes it elsewhere, so its
    gradient is finite; the dense form computes it on every row."""

    def __init__(self):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.log_expert = torch.nn.Linear(4, 4)
            self.other = torch.nn.Linear(4, 4)

    def forward(self, x):
        out = torch.zeros_like(x)
        pos = (x[:, 0] > 0).nonzero(as_tuple=True)[0]
        if pos.numel() > 0:
            out[pos] = torch.log(x[pos, :1]) * self.log_expert(x[pos])
        rest = (x[:, 0] <= 0).nonzero(as_tuple=True)[0]
        if rest.numel() > 0:
            out[rest] = self.other(x[rest])
        return out


def test_unselected_rows_put_no_nan_into_the_gradient() -> None:
    """jax.grad of the staged program equals torch autograd of the original (finite) where the
    log is NaN (x < 0) or -inf (x == 0) on rows the router never gives that expert; the rows
    the computation sees there are copies of a selected row, and when it selects none (the last
    case) the emptiness test the user wrote skips the computation under a cond."""
    model = LogOfPositive().eval()
    g = torch.Generator().manual_seed(0)
    cases = []
    for signs in ([1.0, -1.0, 1.0, 0.0, -1.0, 1.0], [1.0] * 6, [-1.0, 1.0, 0.0, 0.0, -1.0, -1.0], [-1.0, 0.0] * 3):
        x = torch.rand(6, 4, generator=g) + 0.1
        x[:, 0] *= torch.tensor(signs)
        cases.append((x,))
    jm = dycl_jax.to_jax(model, cases[0], host="staged")
    assert len(jm.report().bounded_rows) == 2
    for k, args in enumerate(cases):
        with torch.no_grad():
            assert_same(model(*args), jm(*args), f"case {k}")
    assert_gradients_match(model, jm, cases, "log of positive rows")


def test_emptiness_tests_are_decisions_the_torch_trace_records_too() -> None:
    """In the dense form the user's `if sel.numel() == 0: continue` is a staged cond (it skips an
    empty expert); the rewritten torch program run eagerly (jm.trace's reference) records the
    same decisions, each one the truth about that expert's tokens."""
    from dycl_jax.rewrite.api import run_torch_trace
    model, args = _model(None)
    jm = dycl_jax.to_jax(model, args, host="staged")
    routing = _model(None)[0]
    for k, x in enumerate(_inputs(True)):
        want = [tuple(d)[:2] for d in run_torch_trace(model, "forward", x)[1]]
        got = [(d.site, d.value) for d in jm.trace(*x)[1]]
        empty = {e for label in moe.path_of(routing, x) if label[0] == "empty_expert" for e in label[1:]}
        assert got == want and [v for _, v in got] == [e in empty for e in range(moe.NUM_EXPERTS)], (k, got, want)


def test_moe_gradients_match_torch_autograd() -> None:
    """`jax.grad` through the bounded form (every row computed, the selected ones kept by `where`)
    equals torch autograd on the original moe, on inputs that leave each expert empty once."""
    model, args = _model(None)
    jm = dycl_jax.to_jax(model, args)
    assert jm.host == "staged"
    assert_gradients_match(model, jm, list(_inputs(True)), "moe")
