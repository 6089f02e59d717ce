"""Python scalars in arithmetic with float16 / bfloat16 tensors give torch's values: torch computes
such ops in float32 and rounds once, so a scalar beyond float16's range or below its resolution
still counts. Values are chosen where rounding the scalar first changes the result."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import dycl_jax


class ScaleLike(nn.Module):
    """Normalisation by a large constant, a tiny epsilon, and an alpha below half resolution."""

    def forward(self, x):
        big = x / 70000.0 * 65536.0  # 70000 is inf in float16
        tiny = x * 1e-5 * 1e4  # 1e-5 rounds to a subnormal in float16
        eps = (x + 1e-4) - x  # lost entirely if 1e-4 is added in float16 to large x
        mixed = torch.add(x, x, alpha=0.1)
        return big, tiny, eps, mixed, 3.0 - x * 0.1


class Inv(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 100000  # an int attribute: a Python int scalar beyond float16's range

    def forward(self, x):
        return (x * self.scale) / 100001, x.mul(0.3333333).sub(1e-3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cls", [ScaleLike, Inv])
def test_half_arithmetic_with_python_scalars_matches_torch(cls, dtype):
    torch.manual_seed(0)
    model = cls().eval()
    xs = [(torch.rand(64) * s).to(dtype) for s in (1.0, 100.0, 1000.0)]
    jm = dycl_jax.to_jax(model, (xs[0],))
    for x in xs:
        with torch.no_grad():
            want = model(x)
        got = jm(x)
        for k, (w, g) in enumerate(zip(want, got)):
            g = np.asarray(g)
            assert str(g.dtype) == str(w.dtype).removeprefix("torch."), (k, g.dtype, w.dtype)
            # the same rounding as torch: equal bit for bit (no tolerance), NaN/inf included
            np.testing.assert_array_equal(g.astype(np.float32), w.float().numpy(), err_msg=f"output {k}")


def test_rounding_the_scalar_first_would_differ():
    """The cases above are ones where float16 scalar rounding changes the answer."""
    x = torch.tensor([1000.0], dtype=torch.float16)
    assert torch.isinf(torch.tensor(70000.0).half())
    assert (x / 70000.0).item() != 0 and torch.isfinite(x / 70000.0).all()
    assert (x * torch.tensor(1e-5).half() * 1e4).item() != (x * 1e-5 * 1e4).item()
