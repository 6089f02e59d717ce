"""Bounded while loops: the bound is found only where sound, and gradients flow through them."""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from flax import nnx
from torch._higher_order_ops import while_loop

import dycl_jax
from examples.dynn import load
import converted  # tests/: the example conversions this process made already


def _bounds(jm: dycl_jax.JaxModel) -> list:
    from dycl_jax.lower.interpreter import LoweredGraph

    graph = next(c.cell_contents for c in jm._fn.__closure__ if isinstance(c.cell_contents, LoweredGraph))
    return [s.loop_bound for s in graph.steps if s.node.target is torch.ops.higher_order.while_loop]


class Counted(torch.nn.Module):
    def __init__(self, start: int, limit: int, step: int) -> None:
        super().__init__()
        self.start, self.limit, self.step = start, limit, step

    def forward(self, x):
        n0 = torch.full((), self.start, dtype=torch.int64)
        return while_loop(lambda n, y: (y.sum() < 50) & (n < self.limit),
                          lambda n, y: (n + self.step, y * 1.1 + 1), (n0, x))


class Unbounded(torch.nn.Module):
    def forward(self, x):
        return while_loop(lambda y: y.sum() < 50, lambda y: y * 1.1 + 1, (x,))


class CounterFromInput(torch.nn.Module):
    def forward(self, x, n0):
        return while_loop(lambda n, y: (y.sum() < 50) & (n < 8), lambda n, y: (n + 1, y + 1), (n0, x))


@pytest.mark.parametrize("start,limit,step,expected", [(0, 6, 1, 6), (2, 9, 3, 3), (10, 6, 1, 0)])
def test_counter_bound(start, limit, step, expected):
    jm = dycl_jax.to_jax(Counted(start, limit, step), (torch.ones(1, 3),), dynamic_batch=False)
    assert _bounds(jm) == [expected]
    x = np.full((1, 3), 0.5, np.float32)
    want = Counted(start, limit, step)(torch.from_numpy(x))
    for got in (jm(x), jm.apply(nnx.state(jm.module), x)):  # while_loop and fori_loop forms
        assert int(got[0]) == int(want[0])
        np.testing.assert_allclose(np.asarray(got[1]), want[1].numpy(), rtol=1e-5)


def test_no_bound_without_a_constant_counter():
    assert _bounds(dycl_jax.to_jax(Unbounded(), (torch.ones(1, 3),), dynamic_batch=False)) == [None]
    jm = dycl_jax.to_jax(CounterFromInput(), (torch.ones(1, 3), torch.tensor(0)), dynamic_batch=False)
    assert _bounds(jm) == [None]


def test_act_gradients_match_torch_autograd():
    mod = load("act")
    model, jm = converted.default("act")
    assert _bounds(jm) == [model.act.max_steps]
    state = nnx.state(jm.module)
    for args in mod.inputs(4):
        grads = jax.grad(lambda s: jm.apply(s, *args)[0].sum())(state)
        flat = {".".join(map(str, k)): np.asarray(v.get_raw_value()) for k, v in grads.flat_state()}
        model.zero_grad()
        model(*args)[0].sum().backward()
        for name, p in model.named_parameters():
            want = p.grad.numpy() if p.grad is not None else np.zeros_like(flat[name])
            np.testing.assert_allclose(flat[name], want, rtol=1e-4, atol=1e-5, err_msg=name)
