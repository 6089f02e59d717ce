"""dtype support: float16/bfloat16 models, and the int64 policy (int32 where proven, else exact
64-bit; nothing wraps silently)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import dycl_jax
from dycl_jax.errors import UnsupportedDtypeError


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.norm = torch.nn.LayerNorm(4 * 6 * 6)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        h = torch.relu(self.conv(x)).flatten(1)
        return torch.softmax(self.fc(self.norm(h)), dim=-1)


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
def test_half_precision_models(dtype, tol):
    torch.manual_seed(0)
    model = Small().eval().to(dtype)
    x = torch.randn(2, 3, 6, 6).to(dtype)
    jm = dycl_jax.to_jax(model, (x,))
    got = jm(x)
    assert str(got.dtype) == str(dtype).replace("torch.", "")
    want = model(x).float().detach().numpy()
    np.testing.assert_allclose(np.asarray(got, dtype=np.float32), want, atol=tol, rtol=tol)


class Gather(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(100, 4)

    def forward(self, ids):
        return self.emb(ids), ids.max()


class MaxPlusOne(torch.nn.Module):
    def forward(self, ids):
        return ids.max() + 1  # an id at int32's maximum would wrap in int32


def test_int64_inputs_narrow_to_int32_where_proven_and_compare_exactly():
    m = Gather().eval()
    ids = torch.randint(0, 100, (2, 7))
    jm = dycl_jax.to_jax(m, (ids,))
    assert not jm.x64, jm.report().integers
    emb, top = jm(ids.numpy())  # numpy int64 accepted
    assert top.dtype == np.int32 and int(top) == int(m(ids)[1])
    np.testing.assert_allclose(np.asarray(emb), m(ids)[0].detach().numpy(), rtol=1e-6)


def test_int64_input_out_of_int32_range_raises_where_held_as_int32():
    jm = dycl_jax.to_jax(Gather().eval(), (torch.randint(0, 100, (2, 7)),))
    bad = np.full((2, 7), 2**33, dtype=np.int64)
    with pytest.raises(dycl_jax.DyclError, match=r"8589934592 does not fit int32"):
        jm(bad)


def test_arithmetic_that_may_leave_int32_runs_with_64_bit_integers():
    jm = dycl_jax.to_jax(MaxPlusOne().eval(), (torch.randint(0, 100, (2, 7)),))
    assert jm.x64 and "aten.add" in jm.report().integers
    top = jm(torch.tensor([[3, 2**31 - 1, 0, 0, 0, 0, 0]]))
    assert np.asarray(top).dtype == np.int64 and int(top) == 2**31  # int32 would give -2**31


class BigConstant(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("offset", torch.tensor([2**40], dtype=torch.int64))

    def forward(self, x):
        return x + self.offset


def test_int64_constant_beyond_int32_is_exact():
    x = torch.ones(2, 1, dtype=torch.int64)
    jm = dycl_jax.to_jax(BigConstant().eval(), (x,))
    assert jm.x64
    np.testing.assert_array_equal(np.asarray(jm(x)), (x + 2**40).numpy())


class ScalarArith(torch.nn.Module):
    def forward(self, x):
        return x * 3_000_000_000


def test_python_int_beyond_int32_in_arithmetic_is_exact():
    x = torch.arange(6).reshape(2, 3)
    jm = dycl_jax.to_jax(ScalarArith().eval(), (x,))
    np.testing.assert_array_equal(np.asarray(jm(x)), (x * 3_000_000_000).numpy())


class IntegerPowersAndProducts(torch.nn.Module):
    """Integer pow with negative exponents (0, except for the bases 1 and -1) and matrix products
    whose float alpha/beta torch truncates to integers for integer operands; and a float16
    distance whose squares pass 65504 (torch sums them in float32)."""

    def forward(self, base, exps, m, v, half):
        powers = base ** exps, 2 ** exps, base.pow(3)
        products = (torch.addmv(v, m, v, beta=0.6, alpha=2.7), torch.addmm(m, m, m, beta=-1.5, alpha=0.9),
                    torch.baddbmm(m[None], m[None], m[None], beta=1.2, alpha=-2.2))
        return *powers, *products, torch.dist(half, -half)


def test_integer_pow_scaled_products_and_half_dist_match_torch():
    base = torch.tensor([0, 1, -1, 5, -3, 5, -1, 7, 6], dtype=torch.int32)  # jnp.power wraps 5 ** -8
    exps = torch.tensor([-1, -4, -3, -8, 3, -1, -7, 2, -5], dtype=torch.int32)
    g = torch.Generator().manual_seed(0)
    m, v = torch.randint(-5, 6, (4, 4), generator=g, dtype=torch.int32), torch.arange(4, dtype=torch.int32)
    half = torch.full((6,), 150.0, dtype=torch.float16)  # (2 * 150)^2 = 90000 overflows float16
    model, args = IntegerPowersAndProducts(), (base, exps, m, v, half)
    jm = dycl_jax.to_jax(model, args, dynamic_batch=False)
    *ints, dist = jm(*args)
    *want_ints, want_dist = model(*args)
    for want, got in zip(want_ints, ints):
        assert str(np.asarray(got).dtype) == "int32"
        np.testing.assert_array_equal(np.asarray(got), want.numpy())
    assert str(np.asarray(dist).dtype) == "float16"
    np.testing.assert_allclose(np.asarray(dist, np.float32), want_dist.float().numpy(), rtol=2e-3)


class HalfComplex(torch.nn.Module):
    """float16 parts make torch.complex32, which JAX has no dtype for."""

    def forward(self, re, im):
        scale = re.abs().amax() + 1
        z = torch.complex(re / scale, im)  # complex32
        return torch.view_as_real(z * z).float()


def test_complex32_is_refused_at_the_line_that_makes_it():
    re, im = torch.randn(3, 2, dtype=torch.float16), torch.randn(3, 2, dtype=torch.float16)
    line = next(i for i, text in enumerate(open(__file__).read().splitlines(), 1) if "# complex32" in text)
    # auto: the staged program is refused, then the dispatch host refuses too (it cannot hold
    # the value either), at the same line: not a message about the host's values
    with pytest.raises(UnsupportedDtypeError, match="JAX has no complex32 dtype") as refusal:
        dycl_jax.to_jax(HalfComplex(), (re, im))
    assert refusal.value.location is not None and refusal.value.location.line == line, refusal.value
    assert refusal.value.location.file == __file__ and "float32" in (refusal.value.fix or "")
