"""`jm.apply(state, ...)` on the dispatch host with state values other than the converted ones
(fine-tuned in JAX): statements run on the host read the weights from the torch module, and
must see the state's values there too, as the compiled regions do."""
from __future__ import annotations

import copy

import jax
import numpy as np
import torch
import torch.nn as nn
from flax import nnx

import dycl_jax


class NumpyScore(nn.Module):
    """A score read with `.item()` and reduced by numpy decides the path and scales the result."""

    def __init__(self):
        super().__init__()
        self.lin, self.out = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        score = float(np.mean([self.lin(x).sum().item(), 0.5]))
        if score > 0:
            return self.out(x) * score
        return x * score


class GatedHeads(nn.Module):
    """A gate's argmax, read on the host, picks a head from a ModuleList."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(4, 3)
        self.heads = nn.ModuleList(nn.Linear(4, 2) for _ in range(3))

    def forward(self, x):
        k = int(self.gate(x).mean(0).argmax().item())
        return self.heads[k](x), k


def _scaled(model: nn.Module, scale: float) -> nn.Module:
    other = copy.deepcopy(model)
    other.load_state_dict({k: v * scale for k, v in model.state_dict().items()})
    return other


def test_host_statements_read_the_weights_of_the_state_given_to_apply():
    torch.manual_seed(0)
    for model, scale in ((NumpyScore().eval(), 2.0), (GatedHeads().eval(), -1.5)):
        x = torch.randn(6, 4)
        jm = dycl_jax.to_jax(model, (x,), host="dispatch")
        state = nnx.state(jm.module)
        other = jax.tree_util.tree_map(lambda a: a * scale, state)
        for inp in (x, torch.randn(6, 4) * 3):
            with torch.no_grad():
                want, base = _scaled(model, scale)(inp), model(inp)
            for w, g in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(jm.apply(other, inp.numpy()))):
                np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
            # the converted state again: the module's own weights (nothing of the other state stays)
            for w, g in zip(jax.tree_util.tree_leaves(base), jax.tree_util.tree_leaves(jm(inp))):
                np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
