"""Nested functions closing over variables a converted construct reassigns: refused, never stale."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import dycl_jax


class StaleClosure(torch.nn.Module):
    def forward(self, x):
        scale = x.sum()

        def f(y):
            return y * scale

        if x.mean() > 0:
            scale = scale * 2
            x = f(x)
        else:
            x = f(x) - 1
        return x


class StableClosure(torch.nn.Module):
    def forward(self, x):
        scale = x.sum()

        def f(y):
            return y * scale

        if x.mean() > 0:
            x = f(x) + 1
        else:
            x = f(x) - 1
        return x


class ClosureDefinedInBranch(torch.nn.Module):
    def forward(self, x):
        scale = x.sum()
        if x.mean() > 0:
            scale = scale * 2

            def f(y):
                return y * scale

            x = f(x)
        return x


def test_stale_closure_is_refused_with_location():
    with pytest.raises(dycl_jax.DyclError, match=r"(?s)nested function `f` reads `scale`.*test_closure_hazards.py:15"
                                                 r".*fix: no conversion option keeps this yet.*please report it"):
        dycl_jax.to_jax(StaleClosure().eval(), (torch.ones(1, 3),))


def test_closure_over_outer_tensor_fails_loudly_when_staged():
    # the branch graph would capture a tensor of the outer graph: the staged host must stop
    # with an error instead of computing something else
    with pytest.raises(dycl_jax.DyclError):
        dycl_jax.to_jax(StableClosure().eval(), (torch.ones(1, 3),), host="staged")


def test_closure_over_outer_tensor_runs_on_the_dispatch_host():
    # there the closure's values are region inputs like any other
    model = StableClosure().eval()
    jm = dycl_jax.to_jax(model, (torch.ones(1, 3),))
    assert jm.host == "dispatch"
    for x in (torch.ones(1, 3), -torch.ones(1, 3) * 0.5, torch.randn(1, 3), torch.randn(1, 3)):
        np.testing.assert_allclose(np.asarray(jm(x)), model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_closure_defined_inside_the_branch_converts_and_matches():
    model = ClosureDefinedInBranch().eval()
    jm = dycl_jax.to_jax(model, (torch.ones(1, 3),))
    for x in (torch.ones(1, 3), -torch.ones(1, 3) * 0.5, torch.randn(1, 3)):
        np.testing.assert_allclose(np.asarray(jm(x)), model(x).numpy(), rtol=1e-5, atol=1e-6)
