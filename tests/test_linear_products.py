"""torch's linear decomposes into `addmm(bias, x, permute(w, [1, 0]))` (`mm` for a 3-D input): the
lowering contracts x with w's second dimension instead of transposing w, which XLA's CPU
backend would copy on every call once the bias add joins the product (a decode step of the
captioning example at 512 wide: 3.5 ms -> 0.42 ms per step program). Values against torch, and
no transpose of a weight left in the program."""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from torch import nn

import dycl_jax.lower.ops  # noqa: F401  (registers every lowering)
from dycl_jax.capture.export import capture
from dycl_jax.lower.interpreter import LoweredGraph


class Linears(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(24, 40)
        self.nobias = nn.Linear(40, 16, bias=False)
        self.cell = nn.LSTMCell(16, 8)

    def forward(self, x):
        h = torch.relu(self.fc(x))
        h = self.nobias(h)
        if h.dim() == 2:
            hx, cx = self.cell(h)
            return h, hx, cx
        return h


class OtherPermutes(nn.Module):
    """A transposed weight also used elsewhere, and a product with a non-transposed right side."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(12, 12))

    def forward(self, x):
        wt = self.w.t()
        return x @ wt + wt.sum(0), torch.mm(x, self.w) + 1.0


def _lowered(model: nn.Module, x: torch.Tensor) -> tuple[LoweredGraph, list]:
    cap = capture(model.eval(), (x,), dynamic_batch=False)
    state = [jax.numpy.asarray(e.tensor.detach().numpy()) for e in cap.state]
    return LoweredGraph.build(cap.ep.graph_module), [*state, jax.numpy.asarray(x.numpy())]


@pytest.mark.parametrize("shape", [(1, 24), (5, 24), (2, 3, 24)])
def test_linear_layers_match_torch_without_transposing_weights(shape):
    torch.manual_seed(0)
    model, x = Linears(), torch.randn(*shape)
    graph, inputs = _lowered(model, x)
    text = jax.jit(lambda *a: graph(*a)).lower(*inputs).as_text()
    assert "transpose" not in text, [line for line in text.splitlines() if "transpose" in line][:3]
    with torch.no_grad():
        want = model(x)
    got = graph(*inputs)
    for w, g in zip(want if isinstance(want, tuple) else (want,), got, strict=True):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-5, atol=1e-5)


def test_other_permutes_and_plain_products_match_torch():
    torch.manual_seed(0)
    model, x = OtherPermutes(), torch.randn(3, 12)
    graph, inputs = _lowered(model, x)
    with torch.no_grad():
        want = model(x)
    for w, g in zip(want, graph(*inputs), strict=True):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-5, atol=1e-5)
