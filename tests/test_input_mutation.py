"""In-place updates of the caller's tensors: torch changes them, a converted model cannot, so both
hosts refuse with a located InputMutationError; updates of copies convert and match torch."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dycl_jax
from dycl_jax.errors import InputMutationError


class AliasThenAdd(nn.Module):
    """`y = x` then `y.add_(1)` after a host value: the caller's x changes in torch."""

    def forward(self, x):
        y = x
        n = int((x > 0).sum())
        y.add_(1)
        return y[:n]


class RunningStats(nn.Module):
    """instance_norm with running statistics passed in: it updates them in place."""

    def forward(self, x, running_mean, running_var):
        return F.instance_norm(x, running_mean, running_var, use_input_stats=True)


class CopyThenUpdate(nn.Module):
    """The same updates on a clone: nothing of the caller's changes, so it converts."""

    def forward(self, x):
        y = x.clone()
        n = int((y > 0).sum())
        y.add_(1)
        y[y > 1.5] = 0
        return y[:n]


class PassThrough(nn.Module):
    """An argument returned unchanged next to a data-dependent slice."""

    def forward(self, x):
        y = x
        n = int((x > 0).sum())
        return y, x[:n]


@pytest.mark.parametrize("host", ["auto", "dispatch"])
def test_update_of_an_argument_is_refused_at_its_line(host):
    with pytest.raises(InputMutationError) as info:
        dycl_jax.to_jax(AliasThenAdd(), (torch.randn(6),), host=host)
    err = info.value
    assert err.location is not None and err.location.file == __file__
    assert "y.add_(1)" in err.location.code
    assert "clone()" in err.fix


@pytest.mark.parametrize("host", ["auto", "staged", "dispatch"])
def test_running_statistics_updated_in_place_are_refused_under_every_host(host):
    # auto must not fall back to dispatch here: dispatch cannot update the caller's tensors either
    args = (torch.randn(2, 3, 4), torch.zeros(3), torch.ones(3))
    with pytest.raises(InputMutationError):
        dycl_jax.to_jax(RunningStats(), args, host=host, dynamic_batch=False)


def test_updates_of_a_copy_convert_and_match_torch():
    torch.manual_seed(0)
    m = CopyThenUpdate()
    jm = dycl_jax.to_jax(m, (torch.randn(6),))
    assert jm.host == "dispatch"
    for _ in range(5):
        x = torch.randn(6)
        kept = x.clone()
        got = np.asarray(jm(x))
        want = m(x).numpy()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        assert torch.equal(x, kept)


def test_an_argument_returned_unchanged_is_the_same_array():
    jm = dycl_jax.to_jax(PassThrough(), (torch.randn(6),), host="dispatch")
    x = torch.randn(6)
    y, head = jm(x)
    np.testing.assert_array_equal(np.asarray(y), x.numpy())
    assert np.asarray(head).shape == (int((x > 0).sum()),)


def test_conversion_and_calls_under_inference_mode():
    """Inference-mode tensors have no version counter; the update checks must still work."""
    model = CopyThenUpdate().eval()
    with torch.inference_mode():
        jm = dycl_jax.to_jax(model, (torch.randn(6),))
        for _ in range(3):
            x = torch.randn(6)
            np.testing.assert_allclose(np.asarray(jm(x)), model(x).numpy(), rtol=1e-6, atol=1e-6)
    with torch.inference_mode(), pytest.raises(InputMutationError):
        dycl_jax.to_jax(AliasThenAdd(), (torch.randn(6),))


class AliasInBranch(nn.Module):
    """`alias = y` then an in-place update of `alias` inside a data-dependent branch; `y` is returned."""

    def forward(self, x):
        y = x * 2
        alias = y
        if x.sum() > 0:
            alias[0] += 100
        return y


class AliasInNestedPythonBranch(nn.Module):
    """The update sits in an `if` Python decides (on a flag) inside the data-dependent branch."""

    def __init__(self, flag: int = 0):
        super().__init__()
        self.flag = flag

    def forward(self, x):
        y = x * 2
        alias = y
        if x.sum() > 0:
            if self.flag > 1:
                x = x + 1
            else:
                alias.mul_(3.0)
        return y, x


class DeadAliasInBranch(nn.Module):
    """The same update, but only the updated name is read afterwards: nothing is lost."""

    def forward(self, x):
        y = x * 2
        alias = y
        if x.sum() > 0:
            alias[0] += 100
        return alias


def _matches_torch(model, xs, **kw):
    jm = dycl_jax.to_jax(model, (xs[0].clone(),), **kw)
    for x in xs:
        with torch.no_grad():
            want = model(x.clone())
        want, got = (want, jm(x.clone())) if isinstance(want, tuple) else ((want,), (jm(x.clone()),))
        for w, g in zip(want, got):
            if isinstance(w, torch.Tensor):
                np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-5, atol=1e-6)
            else:  # a Python int (a count, an index): exactly
                assert type(g) is type(w) and g == w, (g, w)
    return jm


@pytest.mark.parametrize("cls", [AliasInBranch, AliasInNestedPythonBranch])
@pytest.mark.parametrize("host", ["auto", "staged", "dispatch"])
def test_update_reaching_another_live_name_converts_and_matches_torch(host, cls):
    """The branch returns the updated tensor under `y` too: every name of it sees the update."""
    _matches_torch(cls().eval(), [torch.ones(3), -torch.ones(3), torch.tensor([2.0, -3.0, 0.5])], host=host)


class AliasInAList(nn.Module):
    """The tensor is also an element of a list, updated through the list inside the branch."""

    def forward(self, h):
        v = h * 0.5
        xs = [h, v]
        if h.sum() > 0:
            xs[1].mul_(2.0)
        return h, v


class AliasUpdatedAfterTheJoin(nn.Module):
    """Both names pass through the branch as one tensor, updated there and again after it."""

    def forward(self, h):
        v = h * 0.5
        a = v
        if h.sum() > 0:
            v.add_(h)
        v.mul_(3.0)
        return h, a


class AliasThroughTuplesAfterAnExit(nn.Module):
    """Tuple unpacking makes the alias; the update comes after an early return (left-over code
    after it), inside a nested branch, and the alias is read after that branch."""

    def forward(self, h):
        v, w = h * 0.5, h
        a, b = v, w
        if h.sum() < -2.0:
            return h, a
            h = h * 2.0
        if h.mean() > 0.1:
            v.clamp_(-0.2, 0.2)
        h = h + a
        return h, b


@pytest.mark.parametrize("cls", [AliasInAList, AliasUpdatedAfterTheJoin, AliasThroughTuplesAfterAnExit])
def test_updates_through_aliases_in_branches_match_torch(cls):
    xs = [torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.25, -0.5]]), -torch.ones(2, 3) * 3, torch.ones(2, 3) * 0.05]
    assert _matches_torch(cls().eval(), xs).host == "staged"


class ViewUpdatedInBranch(nn.Module):
    """`a` is a view (a row) of `v`; a branch updates `v` in place: torch changes `a` too, and so does the
    converted model."""

    def forward(self, h):
        v = h * 0.5
        a = v[0]
        if h.sum() > 0:
            v.add_(h)
        return h, a


class AliasedLoopVariables(nn.Module):
    """A data-dependent loop updates `v` in place while reading `a`, the same tensor (torch: each
    iteration reads the update of the one before)."""

    def forward(self, h):
        v = h * 0.5
        a = v
        n = torch.zeros((), dtype=torch.long)
        while h.sum() > 0 and n < 3:
            n = n + 1
            v.add_(h)
            h = h - a
        return h, n


def test_loop_variables_of_one_tensor_that_the_body_never_rebinds_stay_one_tensor():
    xs = [torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.25, -0.5]]), -torch.ones(2, 3), torch.ones(2, 3) * 0.4]
    assert _matches_torch(AliasedLoopVariables().eval(), xs, host="staged").host == "staged"


def test_a_view_updated_through_its_base_in_a_branch_is_made_again_and_matches_torch():
    # was refused; the view is made again from the updated base (rewrite/converters/view_updates.py)
    xs = [torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.25, -0.5]]), -torch.ones(2, 3), torch.ones(2, 3) * 0.4]
    assert _matches_torch(ViewUpdatedInBranch().eval(), xs, host="staged").host == "staged"


def test_update_of_a_name_whose_alias_is_dead_converts():
    model = DeadAliasInBranch().eval()
    jm = dycl_jax.to_jax(model, (torch.ones(3),))
    for x in (torch.ones(3), -torch.ones(3), torch.randn(3)):
        np.testing.assert_allclose(np.asarray(jm(x)), model(x.clone()).numpy(), rtol=1e-6)


class InputUpdatedInBranch(nn.Module):
    """The caller's tensor updated inside a data-dependent branch: torch changes it for the caller."""

    def forward(self, x):
        if x.sum() > 0:
            x[x > 1] = 0
        return x * 2


@pytest.mark.parametrize("host", ["auto", "staged", "dispatch"])
def test_update_of_an_argument_inside_a_branch_is_refused(host):
    with pytest.raises(InputMutationError) as info:
        dycl_jax.to_jax(InputUpdatedInBranch().eval(), (torch.randn(6),), host=host)
    assert info.value.location.file == __file__


class AliasKeptByABranch(nn.Module):
    """`v` may still be `a` after the `if` (when it is not taken); then `v.add_` changes `a` too."""

    def forward(self, h):
        v = h * 0.5
        a = v
        if h.sum() > 0:
            v = torch.sigmoid(h) * v
        v.add_(h)
        return v, a


class AliasKeptByALoop(nn.Module):
    """The same through a loop that may run no iteration (research style: a tensor counter)."""

    def forward(self, h):
        v = h * 0.5
        a = v
        n = torch.zeros((), dtype=torch.long)
        while h.sum() > 0 and n < 2:
            n = n + 1
            v = torch.sigmoid(h) * v
            h = h - 1.0
        v.add_(h)
        return v, a


class ResidualAfterBranch(nn.Module):
    """`identity = x`, a gated block, `x += identity`: `identity` is not read after the update."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        identity = x * 1.0
        x = identity
        if x.sum() > 0:
            x = self.lin(x)
        x += identity
        return x


@pytest.mark.parametrize("cls", [AliasKeptByABranch, AliasKeptByALoop])
def test_update_after_a_construct_that_may_keep_an_alias_runs_that_construct_on_the_dispatch_host(cls):
    """The staged host refuses it at the construct; auto runs the construct in Python (dispatch),
    where `v` stays `a` on the path that leaves it unchanged, and matches torch on both paths."""
    from dycl_jax.errors import AliasedUpdateError

    with pytest.raises(AliasedUpdateError) as info:
        dycl_jax.to_jax(cls().eval(), (torch.ones(2, 3),), host="staged")
    assert info.value.location.file == __file__ and "h.sum() > 0" in info.value.location.code
    assert "`v`" in str(info.value) and "`a`" in str(info.value) and 'host="auto"' in info.value.fix
    jm = _matches_torch(cls().eval(), [torch.ones(2, 3), -torch.ones(2, 3), torch.tensor([[0.5, -1.0, 2.0],
                                                                                         [1.0, 0.25, -0.5]])])
    assert jm.host == "dispatch" and "h.sum() > 0" in jm.dispatch_location.code


def test_update_after_a_construct_whose_alias_is_no_longer_read_converts():
    torch.manual_seed(0)
    model = ResidualAfterBranch().eval()
    jm = dycl_jax.to_jax(model, (torch.ones(2, 3),))
    assert jm.host == "staged"
    for x in (torch.ones(2, 3), -torch.ones(2, 3), torch.randn(2, 3)):
        with torch.no_grad():
            np.testing.assert_allclose(np.asarray(jm(x)), model(x.clone()).numpy(), rtol=1e-6)


class AliasUpdatedInARegion(nn.Module):
    """On the dispatch host (a data-dependent count runs on the host), `v.add_` in a region after
    `a = v`: torch changes `a` too (the region returns the updated tensor under `a` as well)."""

    def forward(self, h):
        v = h * 0.5
        a = v
        k = torch.nonzero(h[0] > 0).shape[0]
        v.add_(h * k)
        return v, a


class AliasFromAnInPlaceMethod(nn.Module):
    """`a = v.mul_(1.0)`: an in-place method returns its tensor (the may-alias relation does not
    follow it); the region holding the update also computes the result, so it takes both names
    as the one array they are."""

    def forward(self, h):
        v = h * 0.5
        a = v.mul_(1.0)
        k = torch.nonzero(h[0] > 0).shape[0]
        v.add_(h * k)
        return v, a


@pytest.mark.parametrize("cls", [AliasUpdatedInARegion, AliasFromAnInPlaceMethod])
def test_update_in_a_dispatch_region_of_a_tensor_another_name_holds(cls):
    xs = [torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.25, -0.5]]), -torch.ones(2, 3)]
    for host in ("auto", "dispatch"):
        assert _matches_torch(cls().eval(), xs, host=host).host == "dispatch"


class AliasKeptThroughAnIslandThenUpdated(nn.Module):
    """`a = v`; an if/elif chain (a staged island on the dispatch host, which a list appended
    in a tensor `while` needs) rebinds `v` on one path only and returns both names; `v` is
    then updated in place on the host: torch's `a` sees it wherever `v` was left as it is."""

    def forward(self, h):
        v = h * 0.5
        a = v
        outs = []
        while h.sum() < 0.5 and len(outs) < 2:
            outs.append(h.sum())
            h = h + 1.0
        if (h > 0).sum() > 3:
            v[:, 1] += 1.0
        elif h.sum() > 0.5:
            v = h + v
        v.add_(h)
        return h + len(outs), a


class AliasMadeInsideAnIsland(nn.Module):
    """Research style: the alias is made inside the island (`a = v` next to a flag built as
    `torch.tensor(1)`), a branch may rebind `v`, a numpy-reduced `.item()` score under
    `no_grad` is host code, and the update through the other name (`a[:, 0] = ...`) follows."""

    def forward(self, h):
        flag = torch.tensor(1)
        v = h * 0.5
        a = v
        if h.mean() > 0 and flag > 0:
            v = v * 2.0
        with torch.no_grad():  # (host code: it ends the island)
            score = float(np.mean([h[0].sum().item(), h[1].sum().item()]))
        a[:, 0] = score
        return v, a


@pytest.mark.parametrize("cls,hosts", [(AliasKeptThroughAnIslandThenUpdated, ("auto", "dispatch")),
                                       (AliasMadeInsideAnIsland, ("auto", "dispatch"))])
def test_names_one_tensor_on_some_paths_of_an_island_stay_one_tensor(cls, hosts):
    """A staged island returns new arrays, so two of its outputs that torch may leave as one
    tensor would part: where they may and a later statement updates one in place, the host
    version runs (at a call where they are one array; always where the island makes the alias)."""
    xs = [torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.25, -0.5]]), -torch.ones(2, 3), torch.ones(2, 3) * 2,
          torch.tensor([[-0.5, 0.2, 0.1], [0.3, -0.4, 0.2]])]
    for host in hosts:
        assert _matches_torch(cls().eval(), xs, host=host).host == "dispatch"


class AliasUpdatedInAnIslandLoop(nn.Module):
    """A Python list appended on one branch puts the method on the dispatch host; a static loop
    inside the other branch of an earlier `if` (a staged island) updates `a`, which is `v`,
    and `v` is read after both: torch's `v` has the update."""

    def forward(self, h):
        v = h * 0.5
        a = v
        outs = []
        if h.sum() > 2.0:
            h = h * 0.9
        else:
            for _ in range(1):
                a[0, 1] = h[1, 1]
                h = h + v
        if h.sum() > -0.5:
            outs.append(h.sum())
        h = torch.sigmoid(h) * v
        return h, len(outs), a


class AliasUpdatedInAnIslandBranch(nn.Module):
    """The same through tuple unpacking, `.item()` values reduced by numpy (host code), and
    in-place `mul_` in a static loop over a tuple of scales (an island) inside a tensor `if`."""

    def forward(self, h):
        w, v = h, h * 0.5
        a, _ = v, w
        best = int(np.argmax([h[0].sum().item(), h[1].sum().item()]))
        if h[best].mean() > 0:
            for scale in (2.0, -0.5):
                a.mul_(scale)
                h = h + a
        return h * v, best


@pytest.mark.parametrize("cls", [AliasUpdatedInAnIslandLoop, AliasUpdatedInAnIslandBranch])
def test_updates_through_aliases_inside_staged_islands_reach_every_name(cls):
    xs = [torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.25, -0.5]]), -torch.ones(2, 3), torch.ones(2, 3) * 2,
          torch.tensor([[-0.5, 0.2, 0.1], [0.3, -0.4, 0.2]])]
    for host in ("auto", "dispatch"):
        assert _matches_torch(cls().eval(), xs, host=host).host == "dispatch"



class AddsToItsInput(nn.Module):
    """`x.add_(1)` on the method's own input, straight-line (the capture sees it)."""

    def forward(self, x):
        x.add_(1.0)
        return x * 2


class AddsToItsInputInABranch(nn.Module):
    """The same under a tensor condition (the branch operator sees it)."""

    def forward(self, x):
        if x.sum() > 0:
            x.add_(1.0)
        return x * 2


@pytest.mark.parametrize("cls", [AddsToItsInput, AddsToItsInputInABranch])
def test_the_staged_refusal_of_an_input_update_never_asks_for_a_model_edit(cls):
    with pytest.raises(InputMutationError) as info:
        dycl_jax.to_jax(cls().eval(), (torch.ones(2, 3),), host="staged")
    assert "`x`" in info.value.fix and "please report it" in info.value.fix, info.value.fix
    assert "clone" not in info.value.fix and "copy" not in info.value.fix, info.value.fix


class CloneThenWriteInBranch(nn.Module):
    """Research style: a branch (and a loop body) copies the argument, then writes into the copy
    (`h = h.clone(); h[:, sel] = ...` with `nonzero` columns): the caller's tensor never changes."""

    def forward(self, h):
        v = h * 0.5
        if v.sum() > 0:
            h = h.clone()
            h[:, 0] = 0.0
        n = torch.zeros((), dtype=torch.long)
        while h.mean() > -0.5 and n < 2:
            n = n + 1
            h = h.clone()
            h[0, 1] = h[0, 1] - 1.0
        return h * 2.0, n


class CloneOnOnePathThenWrite(nn.Module):
    """The copy is made on one path only, the write on both: the other path writes into the
    caller's tensor, which torch changes, so this stays refused."""

    def forward(self, h):
        v = h * 0.5
        if v.sum() > 0:
            if h.mean() > 1.0:
                h = h.clone()
            h[:, 0] = 0.0
        return h * 2.0


@pytest.mark.parametrize("host", ["auto", "staged", "dispatch"])
def test_a_write_into_a_copy_made_in_the_same_branch_converts_and_matches_torch(host):
    model = CloneThenWriteInBranch()
    xs = [torch.ones(2, 3), -torch.ones(2, 3), torch.tensor([[2.0, -1.0, 0.5], [0.0, 1.0, -3.0]])]
    jm = dycl_jax.to_jax(model, (xs[0].clone(),), host=host)
    if host == "auto":
        assert jm.host == "staged"
    for x in xs:
        kept = x.clone()
        want = model(x.clone())
        got = jm(x)
        np.testing.assert_allclose(np.asarray(got[0]), want[0].numpy(), rtol=1e-6, atol=1e-6)
        assert int(got[1]) == int(want[1])
        assert torch.equal(x, kept)


def test_a_write_that_may_reach_the_argument_past_a_copy_on_another_path_stays_refused():
    with pytest.raises(InputMutationError) as info:
        dycl_jax.to_jax(CloneOnOnePathThenWrite(), (torch.ones(2, 3),), host="staged")
    assert info.value.location is not None and info.value.location.file == __file__
