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


XS = (torch.ones(1, 3), -torch.ones(1, 3) * 0.5, torch.tensor([[0.5, -1.0, 2.0]]), torch.tensor([[-2.0, 0.25, 1.0]]))


class LambdaInATensorLoop(torch.nn.Module):
    """`g = lambda ...` reads `s`, which a tensor `while` reassigns before calling `g`."""

    def forward(self, x):
        s = x * 0
        g = lambda t: t * 0.5 + s  # noqa: E731
        n = torch.zeros((), dtype=torch.long)
        while x.sum() > 0 and n < 3:
            s = s + 1
            x = g(x) - 1
            n = n + 1
        return x, n


class ClosureInAnElifChain(torch.nn.Module):
    """An `if`/`elif` chain whose every path reassigns `scale` and calls `f`, also after it."""

    def forward(self, x):
        scale = x.sum()

        def f(y):
            return y * scale

        if x.mean() > 0.5:
            scale = scale * 2
            x = f(x)
        elif x.mean() > 0:
            scale = scale - 1
            x = f(x) + 1
        else:
            x = f(x) - 1
        return x, f(x)


def _outputs(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("cls", [StaleClosure, LambdaInATensorLoop, ClosureInAnElifChain])
@pytest.mark.parametrize("host", ["staged", "auto"])
def test_a_closure_over_a_variable_the_construct_reassigns_converts_and_matches(cls, host):
    model = cls().eval()
    jm = dycl_jax.to_jax(model, (XS[0],), host=host)
    assert jm.host == "staged"
    for x in XS:
        for w, g in zip(_outputs(model(x.clone())), _outputs(jm(x.clone()))):
            np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-5, atol=1e-6)


def test_on_the_dispatch_host_the_closure_is_refused_with_a_host_that_works():
    with pytest.raises(dycl_jax.DyclError, match=r"(?s)nested function `f` reads `scale`.*test_closure_hazards.py:15") \
            as info:
        dycl_jax.to_jax(StaleClosure().eval(), (XS[0],), host="dispatch")
    assert 'host="auto"' in info.value.fix and "clone" not in info.value.fix


class ClosureWithADefault(torch.nn.Module):
    """A default is evaluated when the `def` runs: defined again, it would take another value."""

    def forward(self, x):
        scale = x.sum()

        def f(y, k=2.0):
            return y * scale * k

        if x.mean() > 0:
            scale = scale * 2
            x = f(x)
        return x


def test_a_closure_that_cannot_be_defined_again_is_refused_with_location():
    with pytest.raises(dycl_jax.DyclError, match=r"(?s)nested function `f` reads `scale`.*test_closure_hazards.py:"
                                                 r".*fix: no conversion option keeps this yet.*please report it"):
        dycl_jax.to_jax(ClosureWithADefault().eval(), (XS[0],))


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


class RebindThenCall(torch.nn.Module):
    """`nonzero` needs the dispatch host; `s` is reassigned in straight-line code before `f` runs."""

    def forward(self, x):
        s = x * 2

        def f(t):
            return t + s

        k = torch.nonzero(x[0] > 0).shape[0]
        s = s + k
        return f(x)


class CallThenRebind(torch.nn.Module):
    """The same closure used before the reassignment only: it reads the value torch reads."""

    def forward(self, x):
        s = x * 2

        def f(t):
            return t + s

        k = torch.nonzero(x[0] > 0).shape[0]
        y = f(x)
        s = s + k
        return y, s


XN = (torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.25, -0.5]]), torch.tensor([[-0.5, -1.0, -2.0], [1.0, 0.25, -0.5]]))


def test_a_closure_used_after_a_straight_line_rebind_is_refused_on_the_dispatch_host():
    # the dispatch host opens a closure into its values when a region starts: it answered with the old `s`
    for host in ("auto", "dispatch"):
        with pytest.raises(dycl_jax.DyclError, match=r"(?s)nested function `f` reads `s`, which line \d+ reassigns"
                                                     r".*test_closure_hazards.py:\d+.*please report it"):
            dycl_jax.to_jax(RebindThenCall().eval(), (XN[0],), host=host)


def test_a_closure_used_before_the_rebind_converts_on_the_dispatch_host():
    model = CallThenRebind().eval()
    jm = dycl_jax.to_jax(model, (XN[0],))
    assert jm.host == "dispatch"
    for x in XN:
        for w, g in zip(model(x.clone()), jm(x.clone())):
            np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-6)
