"""Host-side Python that stages: `np.argmax([c.item() for c in cs])` becomes a tensor argmax and a
local list that is only appended to is dropped, so both stage as one program; the nearby forms that
change a result (a list that is read, `np.max` of `.item()` values) still run exactly on dispatch."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from numpy import argmin

import dycl_jax
from dycl_jax.errors import DyclError
from differential import assert_same

N_INPUTS = 40


def _inputs(n: int, seed: int = 0, scale: float = 2.0) -> list[tuple]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, 6, generator=g) * scale,) for _ in range(n)]


class Heads(nn.Module):
    """Early exit over three heads, with a fallback that reduces `.item()` values with numpy."""

    def __init__(self, threshold: float = 0.7, same_heads: bool = False) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.heads = nn.ModuleList([nn.Linear(6, 4) for _ in range(3)])
        if same_heads:  # equal confidences everywhere: a tie on every input
            for h in self.heads[1:]:
                h.load_state_dict(self.heads[0].state_dict())
        self.threshold = threshold

    def forward(self, x):
        outs, confs = [], []
        for i, head in enumerate(self.heads):
            out = head(x)
            conf = F.softmax(out, dim=1).max()
            outs.append(out)
            confs.append(conf)
            if conf.item() > self.threshold:
                return out, i
        best = np.argmax([c.item() for c in confs])
        return outs[best], best


class ArgminStyle(Heads):
    """The same fallback picking the least confident head, numpy's argmin imported by name."""

    def forward(self, x):
        outs = [head(x) for head in self.heads]
        confs = [F.softmax(o, dim=1).max() for o in outs]
        worst = argmin([c.item() for c in confs])
        return outs[worst] * 2, worst


class MaxOfItems(Heads):
    """`np.max` of `.item()` values is a float64 Python value in torch: it stays on the host."""

    def forward(self, x):
        confs = [F.softmax(head(x), dim=1).max() for head in self.heads]
        top = np.max([c.item() for c in confs])
        return x * top, top


class ArrayOfItems(Heads):
    """`np.array` of `.item()` values: a host value the staged host cannot hold."""

    def forward(self, x):
        confs = [F.softmax(head(x), dim=1).max() for head in self.heads]
        best = int(np.array([c.item() for c in confs]).argmax())
        return self.heads[0](x) * best


class Gated(nn.Module):
    """Gated layers that log the skipped ones in a local list that nothing reads."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(4)
        self.layers = nn.ModuleList([nn.Linear(6, 6) for _ in range(3)])
        self.gates = nn.ModuleList([nn.Linear(6, 1) for _ in range(3)])

    def forward(self, x):
        skipped = []
        for t, layer in enumerate(self.layers):
            if self.gates[t](x).item() > 0:
                x = torch.tanh(layer(x))
            else:
                skipped.append(t)
        return x


class GatedReturned(Gated):
    def forward(self, x):
        skipped = []
        for t, layer in enumerate(self.layers):
            if self.gates[t](x).item() > 0:
                x = torch.tanh(layer(x))
            else:
                skipped.append(t)
        return x, skipped


class GatedCounted(Gated):
    def forward(self, x):
        skipped = []
        for t, layer in enumerate(self.layers):
            if self.gates[t](x).item() > 0:
                x = torch.tanh(layer(x))
            else:
                skipped.insert(0, t)
        return x * (len(skipped) + 1)


class GatedAliased(Gated):
    def forward(self, x):
        skipped = []
        kept = skipped
        for t, layer in enumerate(self.layers):
            if self.gates[t](x).item() > 0:
                x = torch.tanh(layer(x))
            else:
                skipped.append(t)
        return x, kept


class GatedTensorLog(Gated):
    """The log holds tensors (a layer's output): not provably free of effects, so it is kept."""

    def forward(self, x):
        log = []
        for t, layer in enumerate(self.layers):
            if self.gates[t](x).item() > 0:
                x = torch.tanh(layer(x))
            else:
                log.append(layer(x))
        return x


def _check(model: nn.Module, jm, inputs: list[tuple]) -> None:
    for k, args in enumerate(inputs):
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*args), f"{type(model).__name__} input {k}")


def _paths(model: nn.Module, inputs: list[tuple]) -> set:
    """(exited early, head index) of each input, read from torch's outputs."""
    with torch.no_grad():
        outs = [model(*a) for a in inputs]
    return {(bool(F.softmax(o, dim=1).max() > model.threshold), int(i)) for o, i in outs}


@pytest.mark.parametrize("make, paths", [(lambda: Heads(), 6), (lambda: Heads(same_heads=True), 2)],
                         ids=["argmax", "ties"])
def test_numpy_index_reduction_of_items_stages(make, paths: int) -> None:
    model = make().eval()
    inputs = _inputs(N_INPUTS)
    jm = dycl_jax.to_jax(model, inputs[0])
    assert jm.host == "staged"
    _check(model, jm, inputs)
    # argmax: each head exits early and is the fallback's pick; ties: head 0 both ways
    assert len(_paths(model, inputs)) == paths


def test_numpy_argmin_imported_by_name_stages_in_a_method_without_branches() -> None:
    model = ArgminStyle().eval()
    inputs = _inputs(N_INPUTS)
    jm = dycl_jax.to_jax(model, inputs[0])
    assert jm.host == "staged"
    _check(model, jm, inputs)
    with torch.no_grad():
        assert {int(model(*a)[1]) for a in inputs} == {0, 1, 2}


def test_ties_and_nans_pick_numpys_index() -> None:
    model = Heads(same_heads=True, threshold=2.0).eval()  # never confident: always the fallback
    jm = dycl_jax.to_jax(model, _inputs(1)[0], host="staged")
    nan = torch.full((1, 6), float("nan"))
    for args in _inputs(5) + [(torch.zeros(1, 6),), (nan,)]:
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*args), "tie or NaN")
        assert int(jm(*args)[1]) == int(want[1]) == 0  # numpy's first index on ties, NaN included


def test_numpy_max_of_items_stays_exact_on_dispatch() -> None:
    model = MaxOfItems().eval()
    inputs = _inputs(10)
    jm = dycl_jax.to_jax(model, inputs[0])
    assert jm.host == "dispatch"
    _check(model, jm, inputs)


def test_numpy_array_of_items_is_refused_where_staged_is_asked_for() -> None:
    model = ArrayOfItems().eval()
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(model, _inputs(1)[0], host="staged")
    err = info.value
    assert err.location is not None and err.location.file.endswith("test_staged_host_values.py"), err
    assert "np.array" in err.location.code
    assert 'host="dispatch"' in (err.fix or "")
    assert "GuardOnDataDependentSymNode" not in str(err)
    jm = dycl_jax.to_jax(model, _inputs(1)[0])
    _check(model, jm, _inputs(10))


def test_an_unread_log_list_is_dropped_and_stages() -> None:
    model = Gated().eval()
    inputs = _inputs(N_INPUTS, scale=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jm = dycl_jax.to_jax(model, inputs[0], host="staged")
    said = [str(w.message) for w in caught if "never read" in str(w.message)]
    assert len(said) == 1 and "`skipped`" in said[0] and "skipped.append(t)" in said[0], said
    _check(model, jm, inputs)
    ran = set()
    for args in inputs:  # every gate opened and closed over these inputs
        _, decisions = jm.trace(*args)
        ran.update(decisions)
    assert {v for _, v in ran} == {True, False}


@pytest.mark.parametrize("cls", [GatedReturned, GatedCounted, GatedAliased], ids=lambda c: c.__name__)
def test_a_log_list_that_is_read_is_kept(cls) -> None:
    model = cls().eval()
    inputs = _inputs(20, scale=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jm = dycl_jax.to_jax(model, inputs[0])
    assert not [w for w in caught if "never read" in str(w.message)]
    assert jm.host == "dispatch"  # one-sided appends that are read: their lengths differ per path
    _check(model, jm, inputs)


def test_a_log_of_computed_tensors_is_kept_and_exact() -> None:
    model = GatedTensorLog().eval()
    inputs = _inputs(20, scale=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jm = dycl_jax.to_jax(model, inputs[0])
    assert not [w for w in caught if "never read" in str(w.message)]
    _check(model, jm, inputs)
