"""A data-dependent construct that leaves nothing read later (no outputs) has no op in the staged
program, so none of the decisions nested in it are made there: the rewritten torch program must
not record them either, or `jm.trace` and `run_torch_trace` disagree on programs whose outputs
are equal (fuzz seed 84854549). Outputs are checked against the original torch model."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import dycl_jax
from dycl_jax.rewrite.api import run_torch_trace
from differential import assert_same


class BreakOnly(nn.Module):
    """The fuzz shape: a static loop whose only statement is a break test, under a tensor `if`."""

    def forward(self, h):
        if h.sum() > -0.5:
            for i in range(3):
                if h.abs().max().item() > 1.5 or h[0, 3] > -1.5:
                    break
        return h * 2


class NestedIfs(nn.Module):
    """Nested tensor `if`s that only compute a name nobody reads, written with elif and a flag."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        y = self.fc(x)
        if y.mean() > 0:
            unused = torch.tensor(1)
            if y.max() > 0.5:
                unused = y * 3
            elif y.min() < -0.5:
                unused = y * 4
        return torch.relu(y)


class LiveAfter(nn.Module):
    """The same nesting with its result read later: an op with outputs, every decision recorded."""

    def forward(self, h):
        total = h.sum() * 0
        if h.sum() > -0.5:
            for i in range(3):
                if h[0, i] > 0.2:
                    total = total + h[0, i]
                    break
        return h * 2 + total


def _inputs(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return [torch.randn(1, 6, generator=g) * (0.2 + k % 4) for k in range(n)]


@pytest.mark.parametrize("cls", [BreakOnly, NestedIfs, LiveAfter])
def test_decisions_of_a_construct_with_no_outputs_are_not_recorded(cls):
    model = cls().eval()
    xs = _inputs(12)
    jm = dycl_jax.to_jax(model, (xs[0],), host="staged")
    traces = set()
    for k, x in enumerate(xs):
        with torch.no_grad():
            want = model(x)
        _, want_trace = run_torch_trace(model, "forward", (x,))
        got, trace = jm.trace(x.numpy())
        assert_same(want, got, f"input {k}")
        assert_same(want, jm(x.numpy()), f"input {k}")
        assert [(d[0], bool(d[1])) for d in trace] == [(d[0], bool(d[1])) for d in want_trace], f"input {k}"
        traces.add(tuple((d[0], bool(d[1])) for d in want_trace))
    if cls is LiveAfter:  # its decisions are all there, and differ between inputs
        assert len(traces) >= 3 and all(traces), traces
    else:
        assert traces == {()}, traces
