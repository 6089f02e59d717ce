"""Where torch autograd stops (`detach`, `.data`, `with torch.no_grad():`), `jax.grad(jm.apply)`
stops too: parameter gradients against torch autograd on the ORIGINAL module, both hosts."""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
import torch.nn as nn
from flax import nnx

import dycl_jax


class StraightThrough(nn.Module):
    """Straight-through rounding: forward rounds, backward is the identity."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.out = nn.Linear(4, 1)

    def forward(self, x):
        y = self.lin(x)
        q = y + (torch.round(y * 2) / 2 - y).detach()
        return self.out(q).sum()


class DataAndNoGrad(nn.Module):
    """A target computed under no_grad, a scale read through `.data`, no branch anywhere."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            target = self.a(x)
        scale = self.b(x).data
        return ((self.a(x) - target * 0.5) ** 2 + scale * self.b(x)).sum()


class GatedNoGrad(nn.Module):
    """A data-dependent branch whose gate statistic is computed under no_grad."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(4, 1)
        self.f = nn.Linear(4, 4)
        self.g = nn.Linear(4, 4)

    def forward(self, x):
        with torch.no_grad():
            p = torch.sigmoid(self.gate(x)).mean()
        if p > 0.5:
            y = self.f(x) * p
        else:
            y = self.g(x) + self.gate(x)
        return y.sum()


def torch_grads(model: nn.Module, *args: torch.Tensor) -> dict[str, np.ndarray]:
    """Parameter gradients of the model's scalar output, by torch autograd (zero where unused)."""
    model.zero_grad()
    model(*args).backward()
    return {n: p.grad.numpy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
            for n, p in model.named_parameters()}


def jax_grads(jm, *args: torch.Tensor) -> dict[str, np.ndarray]:
    """The same by `jax.grad(jm.apply)`, keyed by torch parameter path."""
    state = nnx.state(jm.module)
    grads = jax.grad(lambda s: jm.apply(s, *[a.numpy() for a in args]))(state)
    flat = {".".join(map(str, path)): np.asarray(v.value if hasattr(v, "value") else v)
            for path, v in jax.tree_util.tree_leaves_with_path(grads, is_leaf=lambda v: hasattr(v, "value"))
            for path in [tuple(getattr(k, "key", getattr(k, "name", k)) for k in path)]}
    return {k.removesuffix(".value"): v for k, v in flat.items()}


@pytest.mark.parametrize("cls", [StraightThrough, DataAndNoGrad, GatedNoGrad])
@pytest.mark.parametrize("host", ["auto", "dispatch"])
def test_parameter_gradients_match_torch_autograd(cls, host):
    torch.manual_seed(0)
    model = cls().eval()
    xs = [torch.randn(2, 4) * s for s in (1.0, -1.0, 3.0)]
    jm = dycl_jax.to_jax(model, (xs[0],), host=host)
    for x in xs:
        want = torch_grads(model, x)
        got = jax_grads(jm, x)
        assert set(got) == set(want), (sorted(got), sorted(want))
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=f"{host}: {name}")
        assert any(np.abs(want[n]).max() > 0 for n in want)  # not a vacuous comparison of zeros
