"""In-place updates in host statements (statements torch.export cannot capture, computed on the
dispatch host) reach every name that holds the tensor, as in torch, or are refused at the user's
line: names of one array get one tensor there, and the region alias check runs for them too.
Against the original torch model, on inputs where the data-dependent count differs."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import dycl_jax
from dycl_jax.errors import AliasedUpdateError
from differential import assert_same


def _ident(t):
    return t


_opaque = lambda t: t  # noqa: E731  (a lambda: the alias analysis does not read its body)


class SetThroughOneName(nn.Module):
    """`a = h`, then a host statement sets an element of `h`; `a` is read after it."""

    def forward(self, x):
        h = x * 2
        a = h
        h[0, 0] = float((x > 0).nonzero().shape[0])
        return a * 1, h


class UpdateWithoutRebinding(nn.Module):
    """`a.add_(...)` in a host statement, the tensor read after it under its other name `h`."""

    def forward(self, x):
        h = x * 2
        a = h
        a.add_((h > 0).nonzero().sum())
        return h + 1


class HiddenAlias(nn.Module):
    """`a = _opaque(h)` is one tensor with `h` that the alias analysis cannot see."""

    def forward(self, x):
        h = x * 2
        a = _opaque(h)
        h += (x > 0).nonzero().sum()
        return a * 1, h


class AliasThroughAFunction(nn.Module):
    """`a = _ident(h)`: a user function that returns its argument, whose body the analysis reads."""

    def forward(self, x):
        h = x * 2
        a = _ident(h)
        h += (x > 0).nonzero().sum()
        return a * 1, h


_INPUTS = [torch.tensor([[1.0, -2.0, 3.0], [-1.0, 0.5, 2.0]]), torch.tensor([[-1.0, -2.0, 3.0], [-1.0, -0.5, -2.0]])]


@pytest.mark.parametrize("model, host", [(SetThroughOneName, "dispatch"), (SetThroughOneName, "auto"),
                                         (UpdateWithoutRebinding, "dispatch"), (AliasThroughAFunction, "dispatch"),
                                         (AliasThroughAFunction, "auto")])
def test_an_in_place_host_statement_reaches_every_name_of_the_tensor(model, host) -> None:
    model = model().eval()
    jm = dycl_jax.to_jax(model, (_INPUTS[0],), host=host)
    assert jm.host == "dispatch"
    for x in _INPUTS:
        assert_same(model(x.clone()), jm(x), f"{type(model).__name__} {x.tolist()}")


def test_an_alias_the_analysis_misses_is_refused_at_the_host_statement() -> None:
    with pytest.raises(AliasedUpdateError, match="`a` also holds") as info:  # at conversion's first call
        dycl_jax.to_jax(HiddenAlias().eval(), (_INPUTS[0],), host="dispatch")(_INPUTS[0])
    loc = info.value.location
    assert loc is not None and loc.file == __file__ and "h += (x > 0).nonzero().sum()" in loc.code
    assert "please report it" in info.value.fix and "by name" not in info.value.fix, info.value.fix


class DetachedView(nn.Module):
    """`a = h.detach()` shares `h`'s memory (without a `_base`); a later region updates `h`."""

    def forward(self, x):
        h = x * 2
        a = h.detach()
        n = (x > 0).nonzero().shape[0]
        h.add_(n)
        return a * 1, h


def test_a_detached_view_updated_later_converts_and_matches_torch() -> None:
    """`.detach()` shares memory without a `_base`: the later program takes `a` made again from `h`."""
    model = DetachedView().eval()
    jm = dycl_jax.to_jax(model, (_INPUTS[0],), host="dispatch")
    for x in _INPUTS:
        assert_same(model(x.clone()), jm(x), f"{x.tolist()}")