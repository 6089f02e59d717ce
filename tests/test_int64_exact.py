"""int64 results equal torch's exactly: programs whose int64 values may leave int32 run with
64-bit integers (lower/int_ranges.py decides), the others keep int32. Against the ORIGINAL
torch module, on both hosts, with inputs that do overflow int32."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import dycl_jax


class FeatureHash(nn.Module):
    """Hashing trick: ids times a large multiplier, modulo a table size, then an embedding."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(1009, 4)

    def forward(self, ids):
        slot = (ids * 2654435) % 1009
        return self.table(slot), slot


class RunningSums(nn.Module):
    def forward(self, counts):
        return torch.cumsum(counts, 0), counts.sum(), counts.sum(0, keepdim=True) * 3


class LongOfFloats(nn.Module):
    def forward(self, x):
        return (x * 1e10).long(), x.mul(3e9).to(torch.int64) // 7


class CounterLoop(nn.Module):
    """A data-dependent while whose int64 accumulator grows past int32 on some inputs."""

    def forward(self, x, seed):
        acc = seed.clone()
        n = torch.zeros((), dtype=torch.long)
        while x.sum() > 0 and n < 40:
            acc = acc * 3 + 1
            x = x - 1
            n = n + 1
        return acc, n


class MaskedHash(nn.Module):
    """Data-dependent length (dispatch), then int64 arithmetic past int32 on the selection."""

    def forward(self, ids):
        keep = ids[ids > 0]
        h = keep * 4000037
        return h.cumsum(0), int(keep.numel())


class SmallIndexMath(nn.Module):
    """Index arithmetic that provably fits int32: must not switch to 64-bit integers."""

    def forward(self, ids, x):
        pos = (ids % 1000) * 1000 + 7
        # an int fill (a scalar_tensor of a known value once decomposed) fits too
        tokens = x.argmax(-1).masked_fill(x[:, 0] > 0, 3)
        return pos, x.argmax(-1) + 1, (x > 0).sum(), torch.arange(ids.shape[0]) * 2, tokens


def _exact(want, got, where: str) -> None:
    for i, (w, g) in enumerate(zip(want, got)):
        w = w.numpy() if isinstance(w, torch.Tensor) else np.asarray(w)
        g = np.asarray(g)
        assert w.shape == g.shape, f"{where} output {i}: shape {g.shape} != {w.shape}"
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"{where} output {i}")
        else:
            np.testing.assert_array_equal(g.astype(np.int64), w.astype(np.int64), err_msg=f"{where} output {i}")


def _past_int32(values) -> bool:
    return any(isinstance(v, torch.Tensor) and v.dtype == torch.int64 and v.numel() and int(v.abs().max()) > 2**31
               for v in values)


# name -> (model, inputs from a generator, the int64 values torch computes that must pass int32)
CASES = {
    "hash": (FeatureHash, lambda g: (torch.randint(0, 2**31 - 1, (6,), generator=g),),
             lambda m, ids: [ids * 2654435]),
    "sums": (RunningSums, lambda g: (torch.randint(2**29, 2**30, (5,), generator=g),), lambda m, c: m(c)),
    "long": (LongOfFloats, lambda g: (torch.rand(4, generator=g) * 100 - 50,), lambda m, x: m(x)),
    "loop": (CounterLoop, lambda g: (torch.rand(3, generator=g) * 30, torch.randint(0, 9, (2,), generator=g)),
             lambda m, x, s: m(x, s)),
    "masked": (MaskedHash, lambda g: (torch.randint(-2**30, 2**30, (7,), generator=g),), lambda m, ids: m(ids)),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("host", ["auto", "dispatch"])
def test_int64_results_equal_torch(name, host):
    cls, make, intermediates = CASES[name]
    model = cls().eval()
    g = torch.Generator().manual_seed(7)
    inputs = [make(g) for _ in range(6)]
    jm = dycl_jax.to_jax(model, inputs[0], host=host)
    beyond = False
    for k, args in enumerate(inputs):
        with torch.no_grad():
            want = model(*args)
        _exact(want, jm(*args), f"{name}/{host} input {k}")
        with torch.no_grad():
            beyond |= _past_int32(intermediates(model, *args))
    assert beyond, "no input took an int64 value past int32: the test would not see wrapping"
    if jm.host == "staged":
        assert jm.x64 and "64-bit" in jm.report().integers


def test_int64_that_fits_stays_int32():
    model = SmallIndexMath().eval()
    args = (torch.tensor([5, 123456, 2**31 - 2]), torch.randn(3, 6))
    jm = dycl_jax.to_jax(model, args)
    assert jm.host == "staged" and not jm.x64, jm.report().integers
    with torch.no_grad():
        _exact(model(*args), jm(*args), "small")


def test_int64_inputs_beyond_int32_are_refused_when_held_as_int32():
    jm = dycl_jax.to_jax(SmallIndexMath().eval(), (torch.tensor([1, 2, 3]), torch.randn(3, 6)))
    with pytest.raises(dycl_jax.DyclError):
        jm(torch.tensor([1, 2, 2**40]), torch.randn(3, 6))


class Float64Model(nn.Module):
    """A float64 model: values below float32's resolution must survive."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3).double()

    def forward(self, x):
        return self.lin(x) * 1e-9 + 1.0


def test_float64_models_keep_float64():
    torch.manual_seed(0)
    model = Float64Model().eval()
    x = torch.randn(2, 3, dtype=torch.float64)
    jm = dycl_jax.to_jax(model, (x,))
    got = np.asarray(jm(x))
    with torch.no_grad():
        want = model(x).numpy()
    assert jm.x64 and got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)
    assert np.abs(want - 1.0).max() < 1e-7  # in float32 every output would round to 1.0


class NonzeroSum(nn.Module):
    """A sum over a size only the data decides (`nonzero`): its range is unknown, not an error."""

    def forward(self, x):
        return (x > 0).nonzero().sum(0)


def test_a_sum_over_a_data_dependent_size_converts():
    model = NonzeroSum().eval()
    xs = [torch.tensor([[1.0, -1.0], [2.0, 3.0]]), torch.tensor([[-1.0, 5.0], [-2.0, -3.0]])]
    jm = dycl_jax.to_jax(model, (xs[0],))
    for k, x in enumerate(xs):
        _exact(model(x), jm(x), f"nonzero sum input {k}")


class CountsRows(nn.Module):
    """A fill of a symbolic size (the batch, with dynamic_batch=True) is a size: it fits int32."""

    def forward(self, x):
        return torch.full((1,), x.shape[0], dtype=torch.long), x.argmax(-1)


def test_a_fill_of_a_symbolic_size_stays_int32():
    model = CountsRows().eval()
    jm = dycl_jax.to_jax(model, torch.randn(4, 5), dynamic_batch=True)
    assert jm.host == "staged" and not jm.x64, jm.report().integers
    for n in (2, 7):
        x = torch.randn(n, 5)
        _exact(model(x), jm(x), f"rows={n}")


class CastsOutOfRange(nn.Module):
    """Float → int casts of NaN, ±inf and values beyond the target's range, in three styles."""

    def forward(self, x):
        return x.long(), x.int(), (x * 2).to(torch.int64), x.to(torch.uint8), x.short(), x.char(), \
            x.type(torch.LongTensor)


SPECIAL = [float("nan"), float("inf"), -float("inf"), 3e9, -3e9, 1e20, -1e20, 2.5, -2.5, 200.0, -129.0, 65504.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
@pytest.mark.parametrize("host", ["staged", "dispatch"])
def test_float_to_int_casts_outside_the_range_follow_torch(dtype, host):
    # torch's CPU cast is the machine's C cast (x86: the most negative int for NaN, inf and
    # out-of-range values); XLA alone saturates, so 0 for NaN and the maximum for inf
    model = CastsOutOfRange()
    x = torch.tensor(SPECIAL, dtype=dtype)
    jm = dycl_jax.to_jax(model, (x,), host=host)
    with torch.no_grad():
        want = model(x)
    got = jm(x)
    assert len(want) == len(got)
    for k, (w, g) in enumerate(zip(want, got)):
        assert np.asarray(g).tolist() == w.tolist(), (k, x.tolist(), w.tolist(), np.asarray(g).tolist())
