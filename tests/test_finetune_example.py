"""examples/finetune_early_exit.py, short: the loss goes down, the exits taken change, and the
torch model loaded with the trained state_dict gives the trained JAX model's outputs; tied
weights stay tied."""
from __future__ import annotations

import jax
import numpy as np
import torch
from flax import nnx

import dycl_jax
from dycl_jax.runtime.state import to_state_dict
from examples.finetune_early_exit import finetune  # needs optax: the `test` and `finetune` extras


def test_finetune_early_exit_short_run():
    r = finetune(steps=40, lr=1e-2)
    assert np.mean(r.losses[-5:]) < 0.5 * np.mean(r.losses[:5])
    assert r.exits_before != r.exits_after
    assert r.exits_after[0] > r.exits_before[0]  # the first classifier got confident
    assert sum(r.exits_after.values()) == sum(r.exits_before.values()) == 256
    assert r.max_roundtrip_diff < 1e-5 and r.roundtrip_exits_equal


class _Tied(torch.nn.Module):
    """One Linear registered under two names, as SkipNet's `group2_ds0` / `layer0.downsample`."""

    def __init__(self):
        super().__init__()
        self.shortcut = torch.nn.Linear(4, 4)
        self.block = torch.nn.Sequential(torch.nn.Linear(4, 4))
        self.block.down = self.shortcut

    def forward(self, x):
        if x.sum() > 0:
            return self.block(x) + self.block.down(x)
        return self.shortcut(x)


def test_tied_weights_get_one_variable_one_gradient_and_go_back_to_every_name():
    torch.manual_seed(0)
    model = _Tied().eval()
    x = torch.ones(2, 4)
    jm = dycl_jax.to_jax(model, (x,))
    state = nnx.state(jm.module)
    g = jax.grad(lambda s: jm.apply(s, x.numpy()).sum())(state)
    model(x).sum().backward()
    grads = {".".join(map(str, p)): np.asarray(v.get_raw_value()) for p, v in g.flat_state()}
    np.testing.assert_allclose(grads["block.down.weight"], model.shortcut.weight.grad.numpy(), rtol=1e-5)
    trained = jax.tree_util.tree_map(lambda a, b: a - 0.5 * b, state, g)
    sd = to_state_dict(trained, model.state_dict())
    model.load_state_dict(sd)
    assert torch.equal(sd["shortcut.weight"], sd["block.down.weight"])
    with torch.no_grad():
        np.testing.assert_allclose(model(x).numpy(), np.asarray(jm.apply(trained, x.numpy())), rtol=1e-5, atol=1e-6)
