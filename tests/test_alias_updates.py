"""In-place updates of a tensor several names hold, inside converted loops and branches and
across dispatch regions: matched against the ORIGINAL torch model (floats within 1e-5 relative,
1e-6 absolute; ints exactly), or refused with a located AliasedUpdateError where no host can
keep the update (a view the dispatch host holds as a separate array)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import dycl_jax
from dycl_jax.errors import AliasedUpdateError, StagedAliasError

XS = [torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.25, -0.5]]), -torch.ones(2, 3), torch.ones(2, 3) * 2]


def _matches_torch(model: nn.Module, xs: list[torch.Tensor], **kw) -> dycl_jax.JaxModel:
    jm = dycl_jax.to_jax(model, (xs[0].clone(),), **kw)
    for x in xs:
        with torch.no_grad():
            want = model(x.clone())
        got = jm(x.clone())
        assert len(got) == len(want)
        for w, g in zip(want, got):
            if w.dtype.is_floating_point:
                np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-5, atol=1e-6)
            else:
                np.testing.assert_array_equal(np.asarray(g), w.numpy())
    return jm


class ColumnWrittenInATensorLoop(nn.Module):
    """`a = v`; a tensor-conditioned loop with a tensor counter writes a column through `a`;
    `v` is read after it: torch's `v` has every write (the loop carries them as one tensor)."""

    def forward(self, h):
        v = h * 0.5
        a = v
        n = torch.zeros((), dtype=torch.long)
        while h.sum() > 0.5 and n < 3:
            n = n + 1
            a[0, 1] = h[1, 1]
            h = h * 0.9 - 0.2
        return h * v, n, a


class AddThroughOneNameReadThroughTheOther(nn.Module):
    """Research style: `v.add_` in the loop body while the body reads the other name `a`, which
    is the same tensor (each iteration sees the previous one's update), under a `.item()` test
    and a flag built as `torch.tensor(1)`."""

    def forward(self, x):
        v = x * 0.5
        a = v
        total = x.sum() * 0.0
        k = torch.tensor(1)
        while v.abs().max().item() < 4.0 and k < 4:
            v.add_(x.abs() + 0.5)
            total = total + a.sum()
            k = k + 1
        return v + a, total, k


class InPlaceResultUpdatedInABranch(nn.Module):
    """`a = v.mul_(2.0)` is `v` itself; a branch on a numpy-reduced `.item()` updates `v`."""

    def forward(self, h):
        v = h * 0.5
        a = v.mul_(2.0)
        if float(np.mean([h[0].sum().item(), h[1].sum().item()])) > 0:
            v.add_(1.0)
        return h + a, v


@pytest.mark.parametrize("cls", [ColumnWrittenInATensorLoop, AddThroughOneNameReadThroughTheOther,
                                 InPlaceResultUpdatedInABranch])
def test_updates_through_another_name_stay_staged_and_match_torch(cls):
    assert _matches_torch(cls().eval(), XS).host == "staged"


class ViewUpdatedInALaterRegion(nn.Module):
    """`a` is a row of `v` (a view); a data-dependent count puts the method on the dispatch host,
    where the update of `v` after it runs in another program: torch's `a` changes too."""

    def forward(self, h):
        v = h * 0.5
        a = v[0]
        k = torch.nonzero(h[0] > 0).shape[0]
        v.add_(h * k)
        return v, a


class ViewMadeOnTheHost(nn.Module):
    """The same with the view made by a host statement (a slice of data-dependent length)."""

    def forward(self, h):
        v = h * 0.5
        a = v[: int((h > 0).sum())]
        k = torch.nonzero(h[0] > 0).shape[0]
        v.add_(h * k)
        return v, a.sum()


def test_a_view_updated_in_a_later_region_converts_on_the_dispatch_host():
    assert _matches_torch(ViewUpdatedInALaterRegion().eval(), XS).host == "dispatch"


@pytest.mark.parametrize("cls,code", [(ViewMadeOnTheHost, "a = v[: int((h > 0).sum())]")])
def test_a_view_the_dispatch_host_cannot_keep_is_refused_at_its_line(cls, code):
    with pytest.raises(AliasedUpdateError) as info:
        dycl_jax.to_jax(cls().eval(), (XS[0].clone(),))
    assert info.value.location.file == __file__ and info.value.location.code == code
    assert "`a`" in str(info.value) and "`v`" in str(info.value) and "`a`" in info.value.fix
    # no host keeps it: a limitation to report, never a request to change the model
    assert "please report it" in info.value.fix and "clone" not in info.value.fix, info.value.fix


class ViewOfADeadTensor(nn.Module):
    """`v = v.view(-1)`: no name holds the old tensor any more, so the update loses nothing."""

    def forward(self, h):
        v = h * 0.5
        v = v.view(-1)
        k = torch.nonzero(h[0] > 0).shape[0]
        v.add_(float(k))
        return v


def test_a_view_whose_base_no_name_holds_converts_on_the_dispatch_host():
    assert _matches_torch(ViewOfADeadTensor().eval(), XS[:2]).host == "dispatch"


def _bump(t, n):
    t.add_(n)


class HelperUpdatesItsArgument(nn.Module):
    """A host statement (a data-dependent count) passes `v` to a helper that updates it in place
    and does not rebind `v`; `a` is the same tensor."""

    def forward(self, h):
        v = h * 0.5
        a = v
        _bump(v, float((h > 0).nonzero().shape[0]))
        return v * 1.0, a * 1.0


class MethodUpdatesARowOfItsArgument(nn.Module):
    """The same through a method of the module, on a row of `v` (`self.scale(v[0], n)`)."""

    def scale(self, t, n):
        t.mul_(n)
        return t

    def forward(self, h):
        v = h * 0.5
        self.scale(v[0], float((h > 0).nonzero().shape[0]))
        return (v * 1.0,)


class OutArgument(nn.Module):
    """`torch.add(v, n, out=v)` in a host statement: torch writes into `v`."""

    def forward(self, h):
        v = h * 0.5
        torch.add(v, float((h > 0).nonzero().shape[0]), out=v)
        return (v * 1.0,)


@pytest.mark.parametrize("cls", [HelperUpdatesItsArgument, MethodUpdatesARowOfItsArgument, OutArgument])
def test_an_update_inside_a_helper_call_or_out_reaches_the_name_on_the_dispatch_host(cls):
    assert _matches_torch(cls().eval(), XS).host == "dispatch"


class AliasMadeInsideTheBranch(nn.Module):
    """`a = v` bound inside the converted branch, then `a.mul_`: `v` (read later) must change."""

    def forward(self, h):
        v = h * 0.5
        if h.sum() > 0:
            a = v
            a.mul_(3.0)
        else:
            a = v * 1.0
        return a * 1.0, v


class HelperMethodInTheBranch(nn.Module):
    """A helper method updates its argument in place inside the branch, and returns it."""

    def bumped(self, t):
        t.add_(1.0)
        return t

    def forward(self, h):
        v = h * 0.5
        a = v
        if h.sum() > 0:
            b = self.bumped(v)
        return a * 1.0, v


def test_an_update_the_staged_branch_cannot_see_is_refused_there():
    with pytest.raises(StagedAliasError) as info:
        dycl_jax.to_jax(AliasMadeInsideTheBranch().eval(), (XS[0].clone(),), host="staged")
    loc = info.value.location
    assert loc.file == __file__ and loc.code == "if h.sum() > 0:" and "`v`" in str(info.value), info.value
    assert 'host="dispatch"' in info.value.fix and "clone" not in info.value.fix and "by name" not in info.value.fix


def test_an_alias_made_inside_the_branch_converts_on_auto_and_matches_torch():
    assert _matches_torch(AliasMadeInsideTheBranch().eval(), XS).host == "dispatch"




def test_a_model_converted_under_inference_mode_still_stages_and_matches_torch():
    # inference tensors have no version counter: the branch-update check must not fail on them
    # (it did, and `auto` then fell back to the dispatch host)
    with torch.inference_mode():
        assert _matches_torch(InPlaceResultUpdatedInABranch().eval(), XS).host == "staged"


class HelperUpdatesItsParameterInABranch(nn.Module):
    """`b = self.bumped(v)`: the helper's own tensor-decided branch updates its parameter in
    place and never rebinds it; the caller's `v` (read after) must see the update (it did not:
    the branch updated a private copy, silently, on both hosts)."""

    def bumped(self, t):
        if t.sum() > 0:
            t.add_(1.0)
        return t * 2

    def forward(self, h):
        v = h * 0.5
        b = self.bumped(v)
        return b, v


@pytest.mark.parametrize("host", ["auto", "dispatch"])
def test_a_helper_parameter_updated_in_its_branch_reaches_the_callers_tensor(host):
    _matches_torch(HelperUpdatesItsParameterInABranch().eval(), XS, host=host)


# ---- calls of user methods, submodules and functions whose effects on their arguments are read
# (analysis/effects.py): each was a located AliasedUpdateError on both hosts before


class SameThenUpdatedInABranch(nn.Module):
    """`a = self.same(v)` is `v` itself (the method returns its argument); the branch updates `v`."""

    def same(self, t):
        return t

    def forward(self, h):
        v = h * 0.5
        a = self.same(v)
        if h.sum() > 0:
            v.add_(1.0)
        return a * 1.0, v


class Passing(nn.Module):
    """A user submodule whose forward may return its input as it is."""

    def forward(self, x):
        if x.shape[0] > 1:
            return x
        return x * 2


class SubmoduleReturnsItsInput(nn.Module):
    """`a = self.gate(v)` is `v`; a row of `v` is written under an `.item()` test."""

    def __init__(self):
        super().__init__()
        self.gate = Passing()

    def forward(self, h):
        v, a = h * 0.5, None
        a = self.gate(v)
        if h.max().item() > 1.0:
            v[0] = h[1] * 3.0
        return a + 0.0, v


class InPlaceLayerInABranch(nn.Module):
    """`nn.ReLU(inplace=True)` called in a branch updates `v`, which `a` also holds."""

    def __init__(self):
        super().__init__()
        self.act = nn.ReLU(inplace=True)

    def forward(self, h):
        v = h - 0.5
        a = v
        if bool(h.mean() < 0.5):
            h = self.act(v) * 2.0
        return a * 1.0, v, h


def _bumped(t, k=1.0):
    t.add_(k)
    return t * 3


class KeywordArgumentAndFunction(nn.Module):
    """The updated tensor passed by keyword to a method, and to a module-level function."""

    def scaled(self, x, t):
        t.mul_(x.sum())
        return x

    def forward(self, h):
        v = h * 0.5
        w = h + 1.0
        a, c = v, w
        if h.sum() > 0:
            b = self.scaled(h, t=v) + _bumped(w, k=2.0)
        else:
            b = h
        return a * 1.0, c * 1.0, b


class ReturnedInATuple(nn.Module):
    """`a, s = self.pair(v)`: `a` is `v`; a branch on `s` updates `v`."""

    def pair(self, t):
        return t, t.sum()

    def forward(self, h):
        v = h * 0.5
        a, s = self.pair(v)
        if s > 0:
            v.add_(1.0)
        return a * 1.0, v


@pytest.mark.parametrize("host", ["auto", "dispatch"])
@pytest.mark.parametrize("cls", [SameThenUpdatedInABranch, HelperMethodInTheBranch, SubmoduleReturnsItsInput,
                                 InPlaceLayerInABranch, KeywordArgumentAndFunction, ReturnedInATuple])
def test_a_call_that_returns_or_updates_its_argument_keeps_torchs_aliases(cls, host):
    jm = _matches_torch(cls().eval(), XS, host=host)
    assert jm.host == ("staged" if host == "auto" else "dispatch")


class Layers(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.act = nn.ReLU()

    def normed(self, t):
        t = t.clone()  # (a new tensor: the caller's is never changed, nor returned)
        t.add_(1.0)
        return t

    def residual(self, x):
        r = x
        x = self.lin(x)  # (from here `x` is a new tensor: `x += r` updates that one)
        x += r
        return x

    def through_the_other_name(self, x):
        r = x
        x = x * 2.0
        r.add_(1.0)  # the caller's tensor, under the name bound before `x` was
        return x

    def forward(self, h):
        return self.normed(self.act(self.lin(h))) + self.residual(h) + self.through_the_other_name(h * 1.0)


def test_layer_calls_and_a_method_that_copies_first_have_no_effect_on_their_arguments():
    # a torch layer (not built inplace) neither returns nor updates its input: were it taken to,
    # every `h = self.layer(x)` would join h and x and widen every region and branch
    from dycl_jax.rewrite.api import _Effects
    model = Layers()
    methods, functions = _Effects().calls(Layers.forward, [model])
    effects = {n: (set().union(*(e.updates for e in found)), set().union(*(e.returns for e in found)))
               for n, found in methods}
    assert effects == {"through_the_other_name": ({"x"}, set())}, effects
    assert functions == ()


# ---------------------------------------------------------------- views made again after a construct
# A view made before a converted branch or loop that updates its base in place (`a = v[0]`, then
# `v.add_(1)` under a tensor condition), read after it: torch's view sees the update, and so does
# the converted model (the view is made again from the new base, converters/view_updates.py).

class RowUpdatedInABranch(nn.Module):
    """`a = v[0]`; a tensor `if` updates `v` in place; only `a` is read after it."""

    def forward(self, h):
        v = h * 0.5
        a = v[0]
        if h.sum() > 0:
            v.add_(1.0)
        return (a * 2,)


class ColumnUpdatedInATensorLoop(nn.Module):
    """`a = v[:, 1]`; a tensor `while` writes `v[0] += 1` on every iteration."""

    def forward(self, h):
        v = h * 0.5
        a = v[:, 1]
        n = torch.zeros((), dtype=torch.long)
        while h.sum() > 0.5 and n < 3:
            v[0] += 1
            h = h * 0.9 - 0.2
            n = n + 1
        return a + 0, n


class ViewsInAnElifChain(nn.Module):
    """Several views (a transposed slice, `.view(-1)`, a row picked by a Python int name) of a
    tensor an `if`/`elif` chain updates on two of its paths."""

    def forward(self, h):
        v = h * 0.5
        a = v[:, 1:].t()
        b = v.view(-1)
        i = 1
        c = v[i]
        if h.sum() > 0:
            v[0] += 1
        elif h.mean() < -0.5:
            v.mul_(2)
        return a * 1, b + 0, c + 0, v


class TransposeReadBetweenTwoBranches(nn.Module):
    """`a = v.T`, read after a first branch and again after a second one."""

    def forward(self, h):
        v = h * 0.5
        a = v.T
        if h.sum() > 0:
            v.add_(1.0)
        y = a * 2
        if h.mean() > 0.3:
            v.mul_(3.0)
        return a + 0, y


@pytest.mark.parametrize("host", ["staged", "dispatch", "auto"])
@pytest.mark.parametrize("cls", [RowUpdatedInABranch, ColumnUpdatedInATensorLoop, ViewsInAnElifChain,
                                 TransposeReadBetweenTwoBranches])
def test_a_view_sees_its_base_updated_in_a_converted_construct(cls, host):
    jm = _matches_torch(cls().eval(), XS, host=host)
    assert jm.host == ("dispatch" if host == "dispatch" else "staged")


class MaskedCopy(nn.Module):
    """`a = v[v > 0]` is a copy: torch's `a` keeps its values when `v` changes."""

    def forward(self, h):
        v = h * 0.5
        a = v[v > 0]
        if h.sum() > 0:
            v.add_(1.0)
        return a.sum() * 2, v


def test_a_copy_made_by_indexing_keeps_its_values():
    _matches_torch(MaskedCopy().eval(), XS)


class ViewUpdatedInTheBranch(nn.Module):
    """The other direction: the branch updates the view `a`, and `v` is read after it."""

    def forward(self, h):
        v = h * 0.5
        a = v[0]
        if h.sum() > 0:
            a.add_(1.0)
        return (v * 1,)


class ViewReadInsideTheBranch(nn.Module):
    """The branch reads `a` after updating `v`: torch's `a` changes inside the branch already."""

    def forward(self, h):
        v = h * 0.5
        a = v[1]
        if h.sum() > 0:
            v.add_(1.0)
            h = h + a
        return a + h,


@pytest.mark.parametrize("cls", [ViewUpdatedInTheBranch, ViewReadInsideTheBranch])
def test_a_view_the_rewrite_cannot_make_again_is_refused_staged_and_converts_on_dispatch(cls):
    """The staged construct holds `a` and `v` as separate arrays: refused there, pointing to the
    dispatch host, whose branch region takes `a` made again from `v` (host/view_families.py)."""
    with pytest.raises(StagedAliasError) as info:
        dycl_jax.to_jax(cls().eval(), (XS[0].clone(),), host="staged")
    assert info.value.location.file == __file__ and info.value.location.code == "if h.sum() > 0:"
    assert 'host="auto"' in info.value.fix or 'host="dispatch"' in info.value.fix, info.value.fix
    assert _matches_torch(cls().eval(), XS).host == "dispatch"
