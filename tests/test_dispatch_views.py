"""Dispatch host: a view (`w = v.view(-1)`, `v.t()`) of a tensor updated in place converts,
whether the update is made in the program that makes the view (its outputs hold the update in
both) or in a later one (a later part of the region, after or inside a host loop)."""
from __future__ import annotations

import pytest
import torch

import dycl_jax
from differential import assert_same
from test_operand_views import _Lin, _cases  # (the same model base and inputs, staged there)


class FlatViewThenUpdate(_Lin):
    """The update before a data-dependent size (`.item()` as a slice bound)."""

    def forward(self, h):
        v = h * 0.5
        w = v.view(-1)
        v.mul_(1.5)
        k = int((h > 0).sum().item())
        h = torch.cat([h[:, :k] * 0.5, h[:, k:]], dim=1)
        return h, v, w * 1.0


class TransposeThenUpdateThroughAlias(_Lin):
    """The update through another name, before a loop over rows with an `.item()` test."""

    def forward(self, h):
        v = self.lin(h)
        a = v
        w = v.t()
        a.add_(1.0)
        out = []
        for row in h:
            if row.sum().item() > 0:
                out.append(w.sum(1) + row)
        return v, w * 1.0, len(out)


class UpdateAfterARead(_Lin):
    """The update in a later part of the region (after the `.item()` read)."""

    def forward(self, h):
        v = h * 0.5
        w = v.view(-1)
        k = int((h > 0).sum().item())
        v.mul_(1.5)
        h = torch.cat([h[:, :k] * 0.5, h[:, k:]], dim=1)
        return h, v, w * 1.0


class UpdateAfterAHostLoop(_Lin):
    def forward(self, h):
        v = self.lin(h)
        w = v.t()
        out = []
        for row in h:
            if row.sum().item() > 0:
                out.append(row)
        v.add_(1.0)
        return v, w * 1.0, len(out)


class UpdateInsideAHostLoop(_Lin):
    """The update in the body of a loop whose iterable the view's region computes (fuzz seed
    241326606: the iterable's temp spans the loop, whose updates were taken to run before it)."""

    def forward(self, h):
        v = self.lin(h)
        a = v
        w = v[:, 1:]
        for j in range(3):
            t = a if h.sum() > 0.0 else v
            t.mul_(0.5)
            h = h * 2.0
        return h, a, w * 1.0


@pytest.mark.parametrize("host", ["dispatch", "auto"])
@pytest.mark.parametrize("cls", [FlatViewThenUpdate, TransposeThenUpdateThroughAlias, UpdateAfterARead,
                                 UpdateAfterAHostLoop, UpdateInsideAHostLoop])
def test_a_view_updated_in_place_converts_and_matches_torch(cls, host):
    """In the program that makes it, or in a later one: host/view_families.py keys the later
    program with the relation, whose capture makes the view of its base again."""
    torch.manual_seed(0)
    model = cls().eval()
    cases = _cases()
    jm = dycl_jax.to_jax(model, cases[0], host=host)
    assert jm.host == "dispatch"
    for k, args in enumerate(cases):
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*(a.numpy() for a in args)), f"{cls.__name__} input {k}")
