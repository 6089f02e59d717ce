"""Bounded row selections (rewrite/rows.py, capture/bounded_rows.py): the MoE `nonzero` gather,
compute and scatter stages as one XLA program equal to the ORIGINAL torch model on every path;
a computation that mixes the selected rows, or indices that may repeat, never takes that form."""
from __future__ import annotations

from functools import lru_cache

import pytest
import torch

import dycl_jax
from dycl_jax.errors import DyclError
from examples.dynn import moe
from differential import assert_same  # pytest puts tests/ on sys.path
from gradient_parity import fewest_covering

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
    paths = set()
    for k, args in enumerate(inputs):
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*args), f"input {k}")
        paths.update(moe.path_of(model, args))
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


@pytest.mark.parametrize("layer", [MixesRows, SumsRows, RepeatedRows])
def test_rows_mixed_or_repeated_refuse_the_bounded_form(layer) -> None:
    model, args = _model(layer)
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(model, args, host="staged")
    err = info.value
    assert err.location is not None and err.location.file == __file__, err
    assert 'host="auto"' in (err.fix or "") and 'host="dispatch"' in (err.fix or "")


def test_rows_mixed_run_on_the_dispatch_host_equal_to_torch() -> None:
    model, args = _model(MixesRows)
    jm = dycl_jax.to_jax(model, args)
    assert jm.host == "dispatch"
    assert "test_bounded_rows.py:" in jm.report().dispatch_reason
    _matches_on_every_path(model, jm, _inputs(True))
