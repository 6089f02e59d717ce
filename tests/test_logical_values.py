"""`and` / `or` used as values return an operand, as in Python, under every host; in tests they
only decide truth. Each case against the ORIGINAL torch module on inputs taking both operands."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dycl_jax
from dycl_jax.errors import DyclError
from differential import assert_same  # pytest puts tests/ on sys.path


class OrValue(nn.Module):
    def forward(self, a, b):
        v = a or b
        return v * 1.5


class AndValue(nn.Module):
    def forward(self, a, b):
        return (a and b) + 1


class Chained(nn.Module):
    """`a or b or c` as a value, and `and`/`or` inside an `if` test of the same function."""

    def forward(self, a, b):
        c = a - b
        v = a or b or c
        if a > 0 and (b < 0 or c > 1):
            v = v * 2
        return v, not a


class MixedOperands(nn.Module):
    """The operands differ in dtype: the result's dtype depends on the data."""

    def forward(self, a, b):
        return a or b.long()


PAIRS = [(torch.tensor([0.0]), torch.tensor([2.0])), (torch.tensor([3.0]), torch.tensor([2.0])),
         (torch.tensor([0.0]), torch.tensor([0.0])), (torch.tensor([-1.0]), torch.tensor([0.0])),
         (torch.tensor([0.5]), torch.tensor([-4.0])), (torch.tensor([0.0]), torch.tensor([-0.5]))]


@pytest.mark.parametrize("cls", [OrValue, AndValue, Chained])
@pytest.mark.parametrize("host", ["staged", "dispatch"])
def test_and_or_values_are_operands(cls, host):
    model = cls().eval()
    jm = dycl_jax.to_jax(model, PAIRS[0], host=host)
    for k, args in enumerate(PAIRS):
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*args), f"{cls.__name__} pair {k}")


def test_operands_of_different_dtypes_are_refused_staged_and_run_on_dispatch():
    model = MixedOperands().eval()
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(model, PAIRS[0], host="staged")
    assert info.value.location is not None and info.value.location.file == __file__
    assert "a or b.long()" in info.value.location.code
    jm = dycl_jax.to_jax(model, PAIRS[0])
    assert jm.host == "dispatch"
    for k, args in enumerate(PAIRS):
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*args), f"pair {k}")
