"""Gradient-trained gated models, written as research code writes them, differentiated with
`jax.grad(jm.apply)` and compared with torch autograd on the ORIGINAL module: a Gumbel-softmax
gate with a straight-through hard sample (the noise is an input, so both sides draw the same),
and BlockDrop's REINFORCE policy (loss = -log_prob * detached advantage), with actions given as
an input or thresholded from the policy's probabilities."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributions import Bernoulli

import dycl_jax
from test_gradient_cuts import jax_grads, torch_grads

DIM, N_BLOCKS, N_CLASSES = 6, 3, 4


class GumbelGated(nn.Module):
    """Per-block two-way gates sampled with Gumbel noise; a block nobody in the batch keeps is
    skipped (`continue`), and the gate usage is collected in a Python list for a sparsity term."""

    def __init__(self, tau: float = 0.7):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh()) for _ in range(N_BLOCKS)])
        self.gates = nn.ModuleList([nn.Linear(DIM, 2) for _ in range(N_BLOCKS)])
        self.head = nn.Linear(DIM, N_CLASSES)
        self.tau = tau

    def forward(self, x, noise, target):
        usage = []
        for i in range(len(self.blocks)):
            logits = self.gates[i](x)
            y_soft = F.softmax((logits + noise[i]) / self.tau, dim=-1)
            index = y_soft.max(-1, keepdim=True)[1]
            y_hard = torch.zeros_like(logits).scatter_(-1, index, 1.0)
            g = y_hard - y_soft.detach() + y_soft  # straight-through: hard forward, soft backward
            usage.append(g[:, 1].mean())
            if y_hard[:, 1].sum() == 0:  # nobody keeps this block: skip its compute
                continue
            x = g[:, 1:2] * self.blocks[i](x) + g[:, 0:1] * x
        out = self.head(x)
        return F.cross_entropy(out, target) + 0.05 * torch.stack(usage).sum()


class BlockDropPolicy(nn.Module):
    """BlockDrop: a policy network's keep-probabilities, Bernoulli actions (given, or thresholded
    at test time as in the paper's code), blocks dropped where no sample keeps them, and the
    REINFORCE loss with a detached reward minus its mean as baseline, plus the task loss."""

    def __init__(self, thresholded: bool = False):
        super().__init__()
        self.policy = nn.Sequential(nn.Linear(DIM, 8), nn.ReLU(), nn.Linear(8, N_BLOCKS))
        self.blocks = nn.ModuleList([nn.Linear(DIM, DIM) for _ in range(N_BLOCKS)])
        self.head = nn.Linear(DIM, N_CLASSES)
        self.thresholded = thresholded

    def forward(self, x, target, actions):
        probs = torch.sigmoid(self.policy(x))
        probs = probs * 0.8 + 0.1  # BlockDrop's exploration bound (alpha)
        if self.thresholded:
            actions = (probs > 0.5).float()
        distr = Bernoulli(probs)
        h = x
        for i, block in enumerate(self.blocks):
            a = actions[:, i].view(-1, 1)
            if a.sum() == 0:
                continue
            h = h + a * F.relu(block(h))
        logits = self.head(h)
        correct = (logits.argmax(1) == target).float()
        sparsity = actions.mean(1)
        reward = correct * (1 - sparsity ** 2) - (1 - correct) * 0.5
        advantage = (reward - reward.mean()).detach()
        log_prob = distr.log_prob(actions).sum(1)
        return -(log_prob * advantage).mean() + F.cross_entropy(logits, target)


def _gumbel_cases():
    g = torch.Generator().manual_seed(1)
    cases = []
    for scale in (1.0, 3.0, -2.0):
        x = torch.randn(3, DIM, generator=g) * scale
        u = torch.rand(N_BLOCKS, 3, 2, generator=g).clamp(1e-6, 1 - 1e-6)
        noise = -torch.log(-torch.log(u))
        cases.append((x, noise, torch.randint(0, N_CLASSES, (3,), generator=g)))
    x, noise, t = cases[0]
    big = noise.clone()
    big[1, :, 0] += 20.0  # every sample drops block 1: the skip path
    cases.append((x, big, t))
    return cases


def _blockdrop_cases():
    g = torch.Generator().manual_seed(2)
    cases = []
    for k in range(3):
        x = torch.randn(16, DIM, generator=g) * (1.0 + k)
        actions = (torch.rand(16, N_BLOCKS, generator=g) > 0.5).float()
        cases.append((x, torch.randint(0, N_CLASSES, (16,), generator=g), actions))
    x, t, actions = cases[0]
    dropped = actions.clone()
    dropped[:, 0] = 0.0  # block 0 dropped for the whole batch
    cases.append((x, t, dropped))
    return cases


def _check(model, cases, host):
    jm = dycl_jax.to_jax(model, cases[0], host=host)
    reached: set[str] = set()
    for k, args in enumerate(cases):
        want, got = torch_grads(model, *args), jax_grads(jm, *args)
        assert set(got) == set(want), (sorted(got), sorted(want))
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=f"{host} case {k}: {name}")
        reached |= {n for n in want if np.abs(want[n]).max() > 0}
    assert reached == {n for n, _ in model.named_parameters()}  # every gradient path was exercised
    return jm


@pytest.mark.parametrize("host", ["auto", "dispatch"])
def test_gumbel_softmax_gate_gradients_match_torch_autograd(host):
    torch.manual_seed(0)
    model = GumbelGated().eval()
    cases = _gumbel_cases()
    jm = _check(model, cases, host)
    if host == "auto":
        assert jm.host == "staged"
    # the skip path really is taken: block 1 gets no gradient in that case only
    grads = torch_grads(model, *cases[-1])
    assert np.abs(grads["blocks.1.0.weight"]).max() == 0 and np.abs(torch_grads(model, *cases[0])["blocks.1.0.weight"]).max() > 0


@pytest.mark.parametrize("thresholded", [False, True])
@pytest.mark.parametrize("host", ["auto", "dispatch"])
def test_blockdrop_reinforce_gradients_match_torch_autograd(host, thresholded):
    torch.manual_seed(0)
    model = BlockDropPolicy(thresholded).eval()
    jm = _check(model, _blockdrop_cases(), host)
    if host == "auto":
        assert jm.host == "staged"


class HostStatement(nn.Module):
    """A gather at data-dependent positions that only the host runs (in torch)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)

    def forward(self, x):
        h = self.lin(x)
        idx = torch.nonzero(h[:, 0] > 0).squeeze(1)
        return h[idx].sum() + h.sum()


def test_grad_through_a_statement_run_in_torch_is_a_located_error():
    """jm(...) runs it; jax.grad(jm.apply) cannot trace torch code, and says where, not a JAX
    tracer error from inside the host."""
    torch.manual_seed(0)
    model = HostStatement().eval()
    x = torch.randn(5, DIM)
    jm = dycl_jax.to_jax(model, (x,), host="dispatch")
    assert jm.report().host_statements
    np.testing.assert_allclose(np.asarray(jm(x)), model(x).detach().numpy(), rtol=1e-5)
    with pytest.raises(dycl_jax.errors.CallError) as err:
        jax_grads(jm, x)
    assert err.value.location.file == __file__ and "nonzero" in err.value.location.code
