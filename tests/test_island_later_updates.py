"""A staged island whose outputs may be one tensor (`a = v` inside it, `v` maybe rebound by a
tensor `if`) must not part them when a statement after the island updates one of them in place:
the update inside the bodies of the `if` whose test ends the island comes after it too (fuzz
seed 814851589 missed it: the island returned `a` and `v` as two arrays and `a` lost the
update). Results equal the original torch model's under host="dispatch" and "auto"."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import dycl_jax
from differential import assert_same


class ReturnInChain(nn.Module):
    """The fuzz shape: an early return inside the chain keeps it on the host; its `else`
    updates `v` in place through a subscript."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        v = h * 0.5
        a = v
        if h[0, 4] > 1.0:
            v = self.lin(h)
        if h.sum() > 3.0:
            if (h > 0).sum() > 4:
                return h * 2.0, a
        elif h.sum() > 0.0:
            v = h * -0.25
        else:
            v[:, 5] += 1.0
        return h + v, a


class RaiseInChain(nn.Module):
    """A `raise` in the chain (input validation) keeps it on the host; the alias is a list
    element, the update an in-place method."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        outs = [h * 0.5]
        v = outs[0]
        if h.mean() > 0.2:
            v = torch.tanh(self.lin(h))
        if torch.isnan(h).any():
            raise ValueError("NaN in the input")
        elif h.sum() < 0.0:
            v.mul_(0.5)
        return outs[0], v


class NoGradInChain(nn.Module):
    """The update under `with torch.no_grad():` (a block no island holds), with `+=` on the
    name (in place for a tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        v = torch.relu(h)
        a = v
        if h[0, 0] > 0.0:
            v = self.lin(h)
        if h.sum() > 1.0:
            v = v * 2.0
        else:
            with torch.no_grad():
                v += 1.0
        return a * 1.0, v


def _cases() -> list[tuple]:
    g = torch.Generator().manual_seed(6)
    return [(torch.randn(1, 6, generator=g) * (0.3 + k % 4) * (1 if k % 3 else -1),) for k in range(12)]


@pytest.mark.parametrize("host", ["dispatch", "auto"])
@pytest.mark.parametrize("cls", [ReturnInChain, RaiseInChain, NoGradInChain])
def test_an_update_after_an_island_reaches_every_name_of_the_tensor(cls, host):
    torch.manual_seed(0)
    model = cls().eval()
    cases = _cases()
    jm = dycl_jax.to_jax(model, cases[0], host=host)
    for k, args in enumerate(cases):
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*(a.numpy() for a in args)), f"{cls.__name__} input {k}")
