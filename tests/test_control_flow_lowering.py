"""torch.cond / torch.while_loop written by hand lower to lax ops that agree with torch."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._higher_order_ops import while_loop

import dycl_jax


class CondThenLoop(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor):
        y = torch.cond(x.sum() > 0, lambda x: self.lin(x).relu(), lambda x: x * 2.0, (x,))

        def test(i, y):
            return (y.abs().sum() < 100) & (i < 10)

        def body(i, y):
            return i + 1, y * 1.5 + 1

        n, y = while_loop(test, body, (torch.tensor(0), y))
        return y, n


class NestedCond(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        def inner(x):
            return torch.cond(x.mean() > 0.5, lambda x: x + 1, lambda x: x - 1, (x,))

        return torch.cond(x.max() > 0, inner, lambda x: x.sin(), (x,))


def _inputs(n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # scales spread the sums across both branches and different loop trip counts
    return [torch.randn(1, 4, generator=g) * (0.2 + 3 * (i % 5)) - float(i % 3 == 0) for i in range(n)]


@pytest.mark.parametrize("cls", [CondThenLoop, NestedCond])
def test_matches_torch_on_every_path(cls):
    model = cls().eval()
    jm = dycl_jax.to_jax(model, (torch.randn(1, 4),), dynamic_batch=False)
    seen: dict[str, set] = {}
    for x in _inputs(40):
        want = model(x)
        got, decisions = jm.trace(x)
        want = want if isinstance(want, tuple) else (want,)
        got = got if isinstance(got, tuple) else (got,)
        for w, g in zip(want, got):
            if w.dtype.is_floating_point:
                np.testing.assert_allclose(np.asarray(g), w.detach().numpy(), rtol=1e-4, atol=1e-5)
            else:
                assert int(g) == int(w)
        for site, value in decisions:
            seen.setdefault(site, set()).add(value)
    assert seen, "no decisions were traced"
    assert all(values == {True, False} for values in seen.values()), seen


def test_loop_count_matches_decisions():
    model = CondThenLoop().eval()
    jm = dycl_jax.to_jax(model, (torch.randn(1, 4),), dynamic_batch=False)
    for x in _inputs(10):
        (_, n), decisions = jm.trace(x)
        loop = [v for site, v in decisions if site.startswith("while")]
        assert loop.count(True) == int(n) and loop[-1] is False


class ShapeChangingCond(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        return torch.cond(x.sum() > 0, lambda x: torch.cat([x, x], 1), lambda x: x * 2, (x,))


def test_branches_of_different_shapes_are_refused_when_staged():
    with pytest.raises(dycl_jax.DyclError, match=r"(?s)true branch.*false branch.*dispatch"):
        jm = dycl_jax.to_jax(ShapeChangingCond(), (torch.randn(1, 4),), dynamic_batch=False, host="staged")
        jm(torch.randn(1, 4))


def test_branches_of_different_shapes_run_on_the_dispatch_host():
    model = ShapeChangingCond()
    jm = dycl_jax.to_jax(model, (torch.randn(1, 4),), dynamic_batch=False)
    assert jm.host == "dispatch"
    for x in (torch.ones(1, 4), -torch.ones(1, 4)):  # one input per branch
        want = model(x)
        got = np.asarray(jm(x))
        assert got.shape == tuple(want.shape)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)
