"""A staged `if` whose branches read a tensor and a view of it (`w = v.view(-1)`, `a = v`): torch.cond
refuses operands that share memory ("might be aliasing the input"), so the staged host passes a
copy of each later one; values equal the original torch model, and in-place updates through such
views keep working as before."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import dycl_jax
from differential import assert_same


class ReturnsViews(nn.Module):
    """The fuzz shape (seed 681515646): an alias and a view returned from an early-return branch."""

    def forward(self, h):
        v = h * 0.5
        a = v
        w = v.view(-1)
        if h.sum() > 0.0:
            return h * 2.0, a, w * 1.0
        h = torch.relu(h) - 0.1
        return h, a, w


class SliceAndTranspose(nn.Module):
    """Views by slicing and transposing, read inside both branches of an if/else."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        y = self.fc(x)
        head = y[:, :3]
        t = y.t()
        if y.mean() > 0:
            out = head.sum() + t[0] * 2
        else:
            out = t[1] - head.mean()
        return out, head, y


class UpdatedInPlace(nn.Module):
    """A branch that updates the base in place while a view of it is read after."""

    def forward(self, h):
        v = h * 0.5
        w = v[:, :3]
        if h.sum() > 0.0:
            v[:, 0] = 5.0
        return v + 0, w * 2


@pytest.mark.parametrize("cls", [ReturnsViews, SliceAndTranspose, UpdatedInPlace])
def test_branches_reading_a_tensor_and_its_view_stage(cls):
    torch.manual_seed(0)
    model = cls().eval()
    g = torch.Generator().manual_seed(6)
    xs = [torch.randn(1, 6, generator=g) * (1 if k % 2 else -1) + 0.1 * k for k in range(8)]
    jm = dycl_jax.to_jax(model, (xs[0],), host="staged")
    taken = set()
    for k, x in enumerate(xs):
        with torch.no_grad():
            want = model(x.clone())
        taken.add(bool(x.sum() > 0))
        assert_same(want, jm(x.numpy()), f"{cls.__name__} input {k}")
    assert len(taken) == 2
