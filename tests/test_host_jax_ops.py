"""Host statements computed by JAX ops (host/jax_ops.py): data-dependent shapes (nonzero, boolean
masks, unique, bincount, repeat_interleave, one_hot without num_classes) and Python values
(`.item()`, `torch.equal`) against the original torch model, on inputs where sizes and order
change; and the cases that must still run in torch (an in-place update through a view)."""
from __future__ import annotations

import pytest
import torch

import dycl_jax
from differential import assert_same
import dycl_jax.lower.ops  # noqa: F401  (registers every lowering, as a conversion does)
from dycl_jax.host import jax_ops


class Routing(torch.nn.Module):
    """Mixture-of-experts style routing written as research code does: masks, nonzero, unique."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x, route):
        picked = (route == 1).nonzero()
        idx = picked[:, 0]
        h = self.proj(x[route > 0])  # a boolean mask, then a jitted region on its exact shape
        experts, inverse, counts = torch.unique(route, return_inverse=True, return_counts=True)
        hist = torch.bincount(route, minlength=2)
        reps = torch.repeat_interleave(counts)
        onehot = torch.nn.functional.one_hot(route)
        n = int(counts.max().item())
        first = route.unique_consecutive()
        if torch.equal(experts, first):
            h = h * 2
        return idx, h.sum(0), experts, inverse, hist, reps, onehot.float().mean(0), n, first


def _cases() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 4, generator=g)
    return [(x, torch.tensor([1, 0, 2, 1, 1, 0])), (x, torch.tensor([0, 0, 1, 1, 3, 3])),
            (x[:5], torch.tensor([2, 2, 2, 0, 1]))]


def test_data_dependent_statements_are_computed_by_jax() -> None:
    model = Routing().eval()
    cases = _cases()
    jm = dycl_jax.to_jax(model, cases[0])
    assert jm.host == "dispatch"
    for args in cases:
        with torch.no_grad():
            assert_same(model(*args), jm(*args), f"route={args[1].tolist()}")
    report = jm.report()
    assert not report.torch_statements, report.torch_statements
    computed = " ".join(report.host_statements)
    for op in ("nonzero", "_unique2", "bincount", "repeat_interleave", "unique_consecutive", "equal"):
        assert f"{op}." in computed, (op, report.host_statements)


def _view_update(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[0].narrow(0, 0, int((x[0] > 0).sum().item())).add_(1.0)  # torch updates y through the view
    return y


def _fresh_update(x: torch.Tensor) -> torch.Tensor:
    y = torch.zeros_like(x)
    y.add_(x[x > 0].sum())  # no view of y exists: the functional result copied in is exact
    return y


def test_in_place_updates_are_exact_or_refused() -> None:
    x = torch.tensor([[0.5, -1.0, 2.0], [1.0, 1.0, -3.0]])
    with pytest.raises(jax_ops.NotInJax, match="in place"):
        jax_ops.run_in_jax(lambda: _view_update(x))
    got, ops = jax_ops.run_in_jax(lambda: _fresh_update(x))
    assert_same(_fresh_update(x), got, "fresh update")
    assert "add.Tensor" in ops and "index.Tensor" in ops, ops


class LeastSquares(torch.nn.Module):
    """torch.export cannot capture lstsq (its residuals' size depends on the rank): a host statement."""

    def forward(self, a, b):
        fit = torch.linalg.lstsq(a, b)
        full = torch.linalg.lstsq(a, b, driver="gelsd")
        return fit.solution, fit.rank, full.residuals, full.singular_values


def test_lstsq_on_the_host_every_driver_output() -> None:
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(2, 6, 3, generator=g), torch.randn(2, 6, 2, generator=g)
    low_rank = a.clone()
    low_rank[..., 2] = low_rank[..., 0] + low_rank[..., 1]  # rank 2: gelsd leaves out the residuals
    jm = dycl_jax.to_jax(LeastSquares(), (a, b))
    for args in ((a, b), (low_rank, b)):
        assert_same(LeastSquares()(*args), jm(*args), "lstsq")
    assert not jm.report().torch_statements, jm.report().torch_statements


def test_nonzero_and_masked_select_on_concrete_arrays_match_torch() -> None:
    """Ranks 1-3 and an empty input, float/int64/bool values, a broadcast and a full mask, and
    `nonzero(as_tuple=True)`: exact values, dtypes and shapes, as torch computes them."""
    for n, shape in enumerate([(5,), (3, 4), (2, 3, 4), (0, 3)]):
        for dtype in (torch.float32, torch.int64, torch.bool):
            g = torch.Generator().manual_seed(n)
            x = torch.randn(shape, generator=g) * 3
            x = x > 0 if dtype is torch.bool else x.to(dtype)
            row, full = torch.randn(shape[-1:], generator=g) > 0, torch.randn(shape, generator=g) > 0.3
            for f in (x.nonzero, lambda: torch.masked_select(x, row), lambda: x.masked_select(full),
                      lambda: x.nonzero(as_tuple=True)[-1]):
                want = f()
                got, ops = jax_ops.run_in_jax(f)
                assert ops and got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want), (shape, dtype, ops)
