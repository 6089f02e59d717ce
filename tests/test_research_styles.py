"""Dynamic networks written in research-code styles (tests/research_styles.py) convert and agree
with the ORIGINAL torch model on inputs that take every path; decisions of `jm.trace` agree with
the rewritten torch program's. Floats within differential.RTOL/ATOL (1e-4), ints and bools exact.
Also: f-strings inside converted code (`self.experts[f"e{e}"]`), and dicts keeping their key
order on the dispatch host (JAX's pytrees sort dict keys)."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn

import dycl_jax
from dycl_jax.errors import DyclError
import research_styles as R  # pytest puts tests/ on sys.path
from differential import assert_same
from dycl_jax.rewrite.api import run_torch_trace


def _plain(out):
    """Outputs as pytrees assert_same reads (a dataclass as its fields, a namedtuple as a tuple),
    after checking the container types are torch's."""
    if dataclasses.is_dataclass(out):
        return dataclasses.asdict(out)
    if isinstance(out, tuple) and hasattr(out, "_fields"):
        return tuple(out)
    return out


def _compare(model, jm, inputs, name, staged_decisions=False):
    traces = []
    for k, args in enumerate(inputs):
        with torch.no_grad():
            want = model(*args)
        got, decisions = jm.trace(*args)
        if not isinstance(want, torch.Tensor):  # containers: the user's own types (dataclass, namedtuple, dict)
            assert type(got) is type(want), f"{name} input {k}: {type(got)} for torch's {type(want)}"
        assert_same(_plain(want), _plain(jm(*args)), f"{name} input {k} (jm(...))")
        assert_same(_plain(want), _plain(got), f"{name} input {k} (jm.trace)")
        if isinstance(want, dict):  # key order is part of a dict's value (iteration, printing)
            assert list(got) == list(want), f"{name} input {k}: keys {list(got)} for torch's {list(want)}"
        traces.append(decisions)
    if staged_decisions:  # after every output matched: a wrong value is reported as such
        for k, (args, decisions) in enumerate(zip(inputs, traces)):
            _, torch_decisions = run_torch_trace(model, "forward", args)
            assert decisions == torch_decisions, f"{name} input {k}: decisions differ"


# --- f-strings in converted code ------------------------------------------------------------

class FStringKeys(nn.Module):
    """`self.blocks[f"b{i}"]` and `getattr(self, f"head{i}")` inside a loop with a tensor `if`:
    the rewrite unparses f-strings (ast's nested unparser of our class)."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict({f"b{i}": nn.Linear(4, 4) for i in range(2)})
        for i in range(2):
            setattr(self, f"head{i}", nn.Linear(4, 2))

    def forward(self, x):
        for i in range(2):
            if x.mean() > 0:
                x = torch.tanh(self.blocks[f"b{i}"](x))
            else:
                x = x - 0.5
        return getattr(self, f"head{int(x.shape[0] > 1)}")(x)


def test_fstrings_in_converted_code():
    torch.manual_seed(0)
    model = FStringKeys().eval()
    inputs = [(torch.full((1, 4), v) + 0.1 * torch.randn(1, 4),) for v in (1.0, -1.0)]
    jm = dycl_jax.to_jax(model, inputs[0], host="staged")
    _compare(model, jm, inputs, "FStringKeys", staged_decisions=True)


# --- dict key order on the dispatch host ------------------------------------------------------

class DictOrder(nn.Module):
    """A dict made in one region and read by order (`.values()`, `list(d)`) in another, across a
    host decision (`.item()`); a returned dict whose keys are not in sorted order, or (`mixed`)
    do not sort at all (`{"zeta": .., 1: ..}`)."""

    def __init__(self, mixed):
        super().__init__()
        self.mixed = mixed

    def forward(self, x):
        feats = {"z": x * 2, "a": x + 1, "m": x.sum(-1, keepdim=True).expand_as(x)}
        if x.mean().item() > 0:
            x = x * 3
        first = list(feats.values())[0]
        names = ",".join(feats)
        return {"zeta": first + x, 1 if self.mixed else "beta": torch.cat(list(feats.values()), -1),
                "alpha": len(names)}


@pytest.mark.parametrize("mixed", [False, True])
def test_dispatch_keeps_dict_key_order(mixed):
    model = DictOrder(mixed).eval()
    inputs = [(torch.randn(1, 3) + s,) for s in (1.0, -1.0)]
    jm = dycl_jax.to_jax(model, inputs[0], host="dispatch")
    _compare(model, jm, inputs, "DictOrder")


# --- Python's max/min over tensors ------------------------------------------------------------

class BuiltinMinMax(nn.Module):
    """`max(a, b)` returns an operand as Python chooses it (`b` if `b > a`): with a NaN that is not
    torch.maximum's NaN; inside a converted branch too (the eager tracer's dry run)."""

    def forward(self, x):
        hi = max(torch.tensor(0.3), x.mean())
        if x.sum() > 0:
            return hi, min([x.max(), torch.tensor(-0.5), x.min()])
        return hi * 2, max(x.min(), torch.tensor(0.1))


class BuiltinMaxShapes(nn.Module):
    """`max` of a 0-d and a (1,)-shaped tensor: Python's result has the shape of the one chosen."""

    def forward(self, x):
        return max(x.mean(), torch.tensor([0.5])) * 2


def test_builtin_max_min_keep_python_semantics():
    model = BuiltinMinMax().eval()
    inputs = [(torch.tensor([[v, w]]),) for v, w in ((1.0, 2.0), (-1.0, -3.0), (float("nan"), 1.0),
                                                      (0.1, 0.2), (-0.2, float("nan")), (0.6, -0.7))]
    jm = dycl_jax.to_jax(model, inputs[0], host="staged")
    _compare(model, jm, inputs, "BuiltinMinMax", staged_decisions=True)


def test_builtin_max_of_different_shapes_is_refused_staged_and_runs_on_dispatch():
    model = BuiltinMaxShapes().eval()
    inputs = [(torch.tensor([[v, v]]),) for v in (1.0, 0.0)]
    with pytest.raises(DyclError, match="depend on the data") as info:
        dycl_jax.to_jax(model, inputs[0], host="staged")
    where = info.value.location
    assert (where.file, where.code.strip()) == (__file__, "return max(x.mean(), torch.tensor([0.5])) * 2")
    assert "torch.maximum" in info.value.fix
    auto = dycl_jax.to_jax(model, inputs[0])
    assert auto.host == "dispatch", auto.report().dispatch_reason
    _compare(model, auto, inputs, "BuiltinMaxShapes")


# --- research-style models ------------------------------------------------------------------

def _built(cls):
    torch.manual_seed(0)
    return cls().eval()


@pytest.mark.parametrize("cls, inputs, host, want_host", [
    (R.Cascade, [R.cascade_inputs(11)[k] for k in (0, 2, 10)], "auto", "staged"),  # exits 2, 0, 1
    (R.MixtureOfDepths, R.mod_inputs(1), "auto", "staged"),  # no data-dependent decision
])
def test_research_models_match_torch(cls, inputs, host, want_host):
    model = _built(cls)
    jm = dycl_jax.to_jax(model, inputs[0], host=host)
    assert jm.host == want_host
    _compare(model, jm, inputs, cls.__name__, staged_decisions=jm.host == "staged")


def test_a_counter_of_a_loop_ended_by_an_item_break_is_refused_staged_at_the_break():
    """The halting RNN's ponder count `n` (a Python int) is counted in a `while True` whose
    `break` an `.item()` test decides: staged, it becomes a tensor, and `int(np.sum(steps))`
    in the `return` needs its value. The refusal points at the `break`'s test and names `n`."""
    model = _built(R.HaltingRNN)
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(model, R.halting_inputs(1)[0], host="staged")
    where = info.value.location
    assert (where.file, where.code.strip()) == (R.__file__, "if p.item() > 0.5 or n >= self.max_ponder:")
    assert "`n`" in str(info.value) and "int(np.sum(steps))" in str(info.value)
    assert 'host="dispatch"' in info.value.fix
