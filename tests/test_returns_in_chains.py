"""An early `return` nested in an if/elif chain that follows another construct that may return:
the statements after the chain run only when no return was taken (fuzz seed 458362664)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import dycl_jax


class StaticElif(nn.Module):
    """The chain's `elif` tests a Python counter (static), the first block returns a tuple."""

    def forward(self, h):
        s = 0
        if h.mean() < 2.0:
            if not (h > 0).sum() > 7:
                return h * 2.0, s
        if h.sum() > -0.5:
            if h.sum() > 1.0:
                return h * 2.0, s
        elif s > 1:
            pass
        s += 1
        return h + 0.5, s


class TensorElif(nn.Module):
    """A tensor `elif`, the return value built in a list, a leftover statement
    after the inner return, and the final value summed over the list."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        h = self.lin(x)
        outs = [h]
        if h.max() > 1.5:
            if h.min() > -0.5:
                return h * 3.0
        if h.sum() > 0.0:
            if h.mean() > 0.2:
                return h * 2.0
                outs.append(h)  # unreachable, as Python drops it
        elif h.sum() < -2.0:
            if h.min() < -1.0:
                return h - 1.0
        h = h + 1.0
        scale = sum(o.abs().mean() for o in outs)
        return h / (1.0 + scale)


def _inputs(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(2, 6, generator=g) * s for s in (0.3, 0.6, 1.0, 2.0) for _ in range(n)]


@pytest.mark.parametrize("cls", [StaticElif, TensorElif])
def test_statements_after_a_chain_with_a_nested_return_run_only_when_it_did_not_return(cls) -> None:
    torch.manual_seed(0)
    model = cls().eval()
    xs = _inputs(4) + [torch.full((2, 6), 0.5), torch.full((2, 6), -0.4)]
    jm = dycl_jax.to_jax(model, xs[0])
    returned_in_chain = 0
    for x in xs:
        with torch.no_grad():
            want = model(x)
        got = jm(x)
        want_t, got_t = (want, got) if isinstance(want, tuple) else ((want,), (got,))
        for w, g in zip(want_t, got_t):
            if isinstance(w, torch.Tensor):
                np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-5, atol=1e-5)
            else:
                assert int(g) == w
        _, decisions = jm.trace(x)
        labels = [d[0].split("@")[0] for d in decisions]
        returned_in_chain += labels[-1] == "if" and len(labels) >= 3 and bool(decisions[-1][1])
    assert returned_in_chain > 0, "no input returned inside the chain: the test misses the case"
