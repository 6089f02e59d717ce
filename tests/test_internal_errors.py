"""Our own exceptions are bugs: a KeyError raised inside dycl_jax while an island (or a region)
is captured or lowered surfaces as that KeyError under host="dispatch" and host="auto", never
answered by the island's host version, a split, or a quiet move from staged to dispatch; a
genuine capture failure of an island still runs its host version and matches torch."""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from torch import nn

import dycl_jax
import dycl_jax.lower.ops  # noqa: F401  (fills the registry)
from dycl_jax.host import numpy_ops
from dycl_jax.lower import registry
from dycl_jax.lower.ops import control_flow, data_dependent
from differential import assert_same  # pytest puts tests/ on sys.path


def _bug(where: object) -> object:
    """A function that raises KeyError as a bug in `where` (one of our modules) would: its frame
    lies in that file, which is how dycl_jax tells its own exceptions from the user's."""
    ns: dict = {}
    exec(compile("def bug(*args, **kwargs):\n    raise KeyError('injected')\n", where.__file__, "exec"), ns)
    return ns["bug"]


def _concrete_bug(where: object, lowering: object) -> object:
    """`lowering` with the bug of `_bug` on concrete arrays only (a host statement computed by
    JAX ops); traced (a region's capture) it computes as before."""
    ns: dict = {"lowering": lowering, "Tracer": jax.core.Tracer}
    exec(compile("def bug(*args, **kwargs):\n"
                 "    if not any(isinstance(a, Tracer) for a in args):\n"
                 "        raise KeyError('injected')\n"
                 "    return lowering(*args, **kwargs)\n", where.__file__, "exec"), ns)
    return ns["bug"]


class NumpyGate(nn.Module):
    """An island (`if` on a tensor) between a numpy-reduced `.item()` and a `with no_grad()`
    block: the island stages on its own, so only its own capture can hit the bug."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        scale = float(np.float32(x.abs().sum().item()) / 4.0)
        with torch.no_grad():
            h = self.fc(x) * scale
        if h.sum() > 0:
            h = torch.sigmoid(h)
        else:
            h = h - 1
        return h


class PlainGate(NumpyGate):
    """The same without the numpy value: it stages, so under host="auto" the bug is met staged,
    where it must not count as a reason to try the dispatch host."""

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:
            h = torch.sigmoid(h)
        else:
            h = h - 1
        return h


class WidthGate(nn.Module):
    """An island whose branches give different widths: it cannot stage (a genuine capture
    failure), so its host version runs; a Python list and a flag built as a tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        outs = [torch.tanh(self.fc(x))]
        flag = torch.tensor(1)
        if outs[-1].sum() > 0:
            y = outs[-1][:, :2] * flag
        else:
            y = outs[-1][:, :3]
        return y


@pytest.mark.parametrize("host, model", [("dispatch", NumpyGate), ("auto", NumpyGate), ("auto", PlainGate)])
def test_an_internal_error_lowering_an_island_surfaces_as_itself(host, model, monkeypatch) -> None:
    torch.manual_seed(0)
    model = model().eval()
    x = torch.randn(2, 4)
    # the cond lowering only an island uses (its host version has no torch.cond)
    monkeypatch.setitem(registry._TABLE, torch.ops.higher_order.cond, _bug(control_flow))
    with pytest.raises(KeyError, match="injected"):
        dycl_jax.to_jax(model, (x,), host=host)(x)


def test_a_genuine_island_capture_failure_runs_its_host_version() -> None:
    torch.manual_seed(0)
    model = WidthGate().eval()
    xs = [torch.randn(1, 4) * 3 for _ in range(4)]
    jm = dycl_jax.to_jax(model, (xs[0],), host="auto")
    widths = set()
    for x in xs:
        with torch.no_grad():
            want = model(x)
        assert_same(want, jm(x), "WidthGate")
        widths.add(want.shape[1])
    assert widths == {2, 3}
    assert jm.host == "dispatch" and jm._fn.failed_islands()


class Picks(nn.Module):
    """A `nonzero` host statement (its size comes from the data), computed by JAX ops (with more
    work after it: `torch.nonzero(...)` or `.nonzero()` alone is a read numpy does, host/reads.py)."""

    def forward(self, x):
        idx = torch.nonzero(x > 0).flatten()
        return idx.sum(0)


@pytest.mark.parametrize("host", ["dispatch", "auto"])
def test_an_internal_error_in_a_host_statements_lowering_surfaces_as_itself(host, monkeypatch) -> None:
    x = torch.tensor([[1.0, -1.0], [2.0, 3.0]])
    nonzero = torch.ops.aten.nonzero.default
    monkeypatch.setitem(registry._TABLE, nonzero, _concrete_bug(data_dependent, registry._TABLE[nonzero]))
    monkeypatch.delitem(numpy_ops.FORMS, nonzero)  # its numpy form would answer before the lowering
    with pytest.raises(KeyError, match="injected"):  # not "torch runs it": the answer would hide the bug
        dycl_jax.to_jax(Picks(), (x,), host=host)(x)


def test_a_host_statement_whose_lowering_cannot_compute_runs_in_torch(monkeypatch) -> None:
    x = torch.tensor([[1.0, -1.0], [2.0, 3.0]])

    def refuses(*args, **kwargs):
        raise NotImplementedError("this lowering cannot compute the case")
    monkeypatch.setitem(registry._TABLE, torch.ops.aten.nonzero.default, refuses)
    monkeypatch.delitem(numpy_ops.FORMS, torch.ops.aten.nonzero.default)  # (answered before the lowering)
    jm = dycl_jax.to_jax(Picks(), (x,), host="dispatch")
    assert_same(Picks()(x), jm(x), "Picks")
    assert any("cannot compute" in line for line in jm.report().torch_statements), jm.report().torch_statements
