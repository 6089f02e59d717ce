"""A staged `if` or tensor `while` that reads a tensor and a view of it (`w = h.t()`,
`v[:, :3]`, `v.view(-1)`) stages when it updates nothing in place: torch.cond / while_loop
refuse operands that share memory and carries whose strides differ from the body's results,
so such operands go in as copies (fuzz seed 603013928: a transposed view carried by a loop
crashed staging). Where the construct does update a tensor in place, staging refuses with a
located AliasedUpdateError (StagedAliasError where only identity is at stake), never torch's
own message and never a wrong answer."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import dycl_jax
from differential import assert_same
from dycl_jax.errors import AliasedUpdateError


class _Lin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)


class TransposeInBranch(_Lin):
    def forward(self, h):
        w = h.t()
        if h.sum() > 0:
            h = self.lin(h) + w.t()
        return h, w * 1.0


class SliceRebound(_Lin):
    """An `else` rebinding the slice, an elif chain."""

    def forward(self, h):
        v = self.lin(h)
        w = v[:, :3]
        if v.sum() > 1.0:
            v = v * 2
        elif v.sum() > -1.0:
            w = w + v[:, 3:]
        else:
            w = w + 1
        return v, w


class FlatViewRead(_Lin):
    def forward(self, h):
        v = self.lin(h)
        w = v.view(-1)
        if v.sum() > 0:
            out = w.sum() + v.mean()
        else:
            out = v.max()
        return out, w


class ViewReadInLoop(_Lin):
    """A loop carrying `h` and reading its transposed view, an early return inside."""

    def forward(self, h):
        w = h.transpose(0, 1)
        n = torch.zeros((), dtype=torch.long)
        while h.sum() > 0 and n < 3:
            n = n + 1
            h = self.lin(h)
            if h.mean() > 0.5:
                return h, w * 1.0
        return h * 2, w + 1.0


class ViewCarried(_Lin):
    """The view itself a loop variable, with a Python counter (`n += 1` is no tensor update)."""

    def forward(self, h):
        w = h.t()
        n = 0
        while h.sum() > 0 and n < 3:
            n += 1
            h = self.lin(h) + w.t()
            w = w * 0.5
        return h, w, n


def _cases() -> list[tuple]:
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(2, 6, generator=g) + (k % 4 - 1.5),) for k in range(10)]


@pytest.mark.parametrize("cls", [TransposeInBranch, SliceRebound, FlatViewRead, ViewReadInLoop, ViewCarried])
def test_a_construct_reading_a_tensor_and_its_view_stages(cls):
    torch.manual_seed(0)
    model = cls().eval()
    cases = _cases()
    jm = dycl_jax.to_jax(model, cases[0], host="staged")
    taken = set()
    for k, args in enumerate(cases):
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*(a.numpy() for a in args)), f"{cls.__name__} input {k}")
        taken.add(tuple(jm.trace(*(a.numpy() for a in args))[1]))
    assert len(taken) > 1, f"{cls.__name__}: the inputs take one path only"


class UpdateThroughList(_Lin):
    """`xs[0]` is `v`, `w` a view of it: the in-place update reaches `w` in torch."""

    def forward(self, h):
        v = self.lin(h)
        xs = [v]
        w = v.t()
        if h.sum() > 0:
            xs[0].mul_(2.0)
        return xs[0] * 1.0, w * 1.0


class UpdateThroughListInLoop(_Lin):
    def forward(self, h):
        v = self.lin(h)
        xs = [v]
        w = v.t()
        n = torch.zeros((), dtype=torch.long)
        while h.sum() > n:
            xs[0].add_(1.0)
            n = n + 1
        return xs[0] * 1.0, w * 1.0


@pytest.mark.parametrize("cls", [UpdateThroughList, UpdateThroughListInLoop])
def test_an_update_reaching_a_view_is_refused_with_a_located_error(cls):
    torch.manual_seed(0)
    model = cls().eval()
    cases = _cases()
    # (the loop's: the element update is seen before staging, and a view no host keeps apart)
    with pytest.raises(AliasedUpdateError) as info:
        dycl_jax.to_jax(model, cases[0], host="staged")
    assert info.value.location is not None and info.value.location.file == __file__
    assert "might be aliasing" not in str(info.value)
    # auto: a located refusal or torch's answers, never another
    try:
        jm = dycl_jax.to_jax(model, cases[0])
    except AliasedUpdateError as exc:
        assert exc.location is not None and exc.location.file == __file__
        return
    for k, args in enumerate(cases):
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*(a.numpy() for a in args)), f"{cls.__name__} input {k}")
