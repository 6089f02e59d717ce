"""The faster lowerings and the cheap call path stay exact: each convolution form against torch
(values and gradients), and the remembered input checks still reject wrong inputs."""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dycl_jax.convert import to_jax
from dycl_jax.errors import CallError
from dycl_jax.lower.ops.conv import convolution

# (batch, cin, cout, size, kernel, stride, padding, dilation, groups, the form _forward picks)
CONV_CASES = [
    (2, 3, 8, 11, 3, 1, 1, 1, 1, "dot"),  # few input channels: im2col + one matrix product
    (2, 3, 16, 12, 5, 2, 2, 1, 1, "dot"),  # (patches gathered in one kernel)
    (8, 3, 8, 32, 3, 1, 1, 1, 1, "dot"),  # (patches too large to gather: stacked slices)
    (1, 8, 16, 9, 3, 1, 1, 2, 1, "conv24"),  # small channels: padded to 24 outputs
    (3, 16, 16, 7, 3, 2, 0, 1, 1, "conv24"),
    (2, 16, 16, 8, 3, 1, 1, 1, 16, "nconv"),  # depthwise: shifted multiply-adds, no conv
    (2, 12, 12, 9, 5, 2, 2, 1, 12, "nconv"),
    (2, 8, 8, 9, 3, 1, 2, 2, 8, "nconv"),
    (2, 16, 32, 6, 1, 1, 0, 1, 1, "dot"),  # pointwise: a matrix product
    (2, 16, 24, 7, 1, 2, 0, 1, 1, "dot"),
    (2, 24, 32, 6, 3, 1, 1, 1, 1, "conv32"),  # large enough: lax as is
    (2, 6, 6, 5, 3, 1, 1, 1, 3, "conv6"),  # grouped but not depthwise: lax
]


def _jax_conv(x, w, b, stride, padding, dilation, groups):
    return convolution(x, w, b, [stride], [padding], [dilation], False, [0], groups)


def _form(fn, *args) -> str:
    """Which form the lowering took: conv<out channels>, dot, or nconv (neither)."""
    prims = {}
    for eqn in jax.make_jaxpr(fn)(*args).jaxpr.eqns:
        prims.setdefault(eqn.primitive.name, eqn)
    if "conv_general_dilated" in prims:
        return f"conv{prims['conv_general_dilated'].outvars[0].aval.shape[-1]}"  # channels-last
    return "dot" if "dot_general" in prims else "nconv"


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "x".join(map(str, c[:9])))
def test_conv_forms_match_torch_values_and_gradients(case) -> None:
    n, cin, cout, size, k, stride, pad, dil, groups, form = case
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, cin, size, size + 1, generator=g, requires_grad=True)
    w = torch.randn(cout, cin // groups, k, k, generator=g, requires_grad=True)
    b = torch.randn(cout, generator=g)
    out = torch.nn.functional.conv2d(x, w, b, stride=stride, padding=pad, dilation=dil, groups=groups)
    cot = torch.randn(out.shape, generator=g)
    (out * cot).sum().backward()

    args = [jnp.asarray(t.detach().numpy()) for t in (x, w, b)]
    fn = lambda xx, ww: _jax_conv(xx, ww, args[2], stride, pad, dil, groups)  # noqa: E731
    # the intended form is really taken (a padded conv shows its 24 output channels)
    assert _form(fn, args[0], args[1]) == form
    got = jax.jit(fn)(args[0], args[1])
    _close(got, out.detach().numpy())
    gx, gw = jax.grad(lambda xx, ww: (fn(xx, ww) * jnp.asarray(cot.numpy())).sum(), argnums=(0, 1))(*args[:2])
    _close(gx, x.grad.numpy())
    _close(gw, w.grad.numpy())


def _close(got, expected) -> None:
    # sums of thousands of products: absolute error scales with the largest value
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model, to_jax(model, (torch.randn(2, 8),))


def test_repeat_calls_match_torch_and_remember_only_passed_shapes(mlp) -> None:
    model, jm = mlp
    for batch in (3, 3, 5):
        x = torch.randn(batch, 8)
        got = jm(jnp.asarray(x.numpy()))
        np.testing.assert_allclose(np.asarray(got), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    remembered = {key[0][1] for key in jm.signature._passed}
    assert remembered == {(3, 8), (5, 8)}
    # torch tensors are converted on every call, so they are never taken on trust
    jm(torch.randn(3, 8))
    assert all(key[0][0] is not torch.Tensor for key in jm.signature._passed)


@pytest.mark.parametrize(
    "bad, message",
    [
        (jnp.ones((3, 9)), "got float32[3, 9]"),
        (jnp.ones((3, 8), jnp.int32), "got int32[3, 8]"),
        (np.ones((3, 8, 1), np.float32), "got float32[3, 8, 1]"),
        (1.0, "got float"),
    ],
)
def test_wrong_inputs_still_raise_after_a_good_call(mlp, bad, message) -> None:
    _, jm = mlp
    jm(jnp.ones((3, 8)))  # a remembered good shape must not let other inputs through
    with pytest.raises(CallError, match=message.replace("[", r"\[")):
        jm(bad)
    with pytest.raises(CallError, match="expected arguments"):
        jm(jnp.ones((3, 8)), jnp.ones((3, 8)))


def test_convolution_inside_cond_compiles_channels_last() -> None:
    """XLA:CPU leaves an NCHW convolution inside a conditional branch as a naive loop (~10x
    slower); the lowering states channels-last itself, so no branch keeps an NCHW one."""
    x = jnp.ones((1, 24, 8, 8))
    w = jnp.ones((32, 24, 3, 3))

    def f(x, w, p):
        conv = lambda x: _jax_conv(x, w, None, 1, 1, 1, 1)  # noqa: E731
        return jax.lax.cond(p, conv, lambda x: conv(x) * 2, x)

    hlo = jax.jit(f).lower(x, w, True).compile().as_text()
    convs = [line for line in hlo.splitlines() if " convolution(" in line or "__ynn_fusion" in line]
    assert convs, "expected the branches to hold convolutions"
    assert not any("dim_labels=bf01" in line for line in convs), "\n".join(convs)
