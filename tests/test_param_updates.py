"""A submodule or helper that updates its list argument inside a converted branch, and never
reads it again there: the caller's list gets the update, as in torch (it was lost before)."""
from __future__ import annotations

import pytest
import torch

import dycl_jax


class Appender(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, outs):
        h = self.fc(x)
        if h.sum() > 0:
            outs.append(h)
        return h


class EitherAppender(Appender):
    def forward(self, x, outs):
        h = self.fc(x)
        if h.sum() > 0:
            outs.append(h)
        else:
            outs.append(-h)
        return h


class Caller(torch.nn.Module):
    def __init__(self, block: torch.nn.Module, guarded: bool) -> None:
        super().__init__()
        self.block = block
        self.guarded = guarded

    def forward(self, x):
        outs = []
        if self.guarded and x.sum() > 0:
            h = self.block(x, outs)
        else:
            h = self.block(-x, outs)
        h = self.block(h, outs)
        return outs, len(outs), h


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(2, 4, generator=g) * 2 for _ in range(12)]


def _same(want, got) -> None:
    assert len(got[0]) == len(want[0]) and int(got[1]) == want[1]
    for w, o in zip(want[0], got[0]):
        torch.testing.assert_close(torch.as_tensor(o), w, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.as_tensor(got[2]), want[2], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("host", ["auto", "dispatch"])
@pytest.mark.parametrize("guarded", [False, True])
def test_an_append_in_a_submodules_branch_reaches_the_callers_list(host: str, guarded: bool) -> None:
    torch.manual_seed(0)
    model = Caller(Appender(), guarded).eval()
    jm = dycl_jax.to_jax(model, (torch.ones(2, 4),), host=host)
    lengths = set()
    for x in _inputs():
        want = model(x)
        lengths.add(want[1])
        _same(want, jm(x))
    assert len(lengths) > 1  # the inputs take both sides of the submodule's `if`


def test_an_append_on_either_side_stages_and_reaches_the_callers_list() -> None:
    torch.manual_seed(0)
    model = Caller(EitherAppender(), guarded=True).eval()
    jm = dycl_jax.to_jax(model, (torch.ones(2, 4),), host="staged")
    for x in _inputs():
        _same(model(x), jm(x))


def test_staged_refuses_an_append_on_one_side_only_at_the_users_line() -> None:
    model = Caller(Appender(), guarded=False).eval()
    with pytest.raises(dycl_jax.DyclError, match="outs") as err:
        dycl_jax.to_jax(model, (torch.ones(2, 4),), host="staged")
    assert err.value.location.file == __file__


# ---------------------------------------------------------------- through module containers
# The blocks of a ModuleList append to the list the caller passes them, called inside a tensor
# branch of the module that holds the list: `for blk in self.blocks:` or `self.blocks[i](h)`. The
# effects analysis follows every element's forward (analysis/effects.py), so the branch owns the
# list and gives the appends back (they were lost on every host, silently).

class Block(torch.nn.Module):
    def __init__(self, k: float) -> None:
        super().__init__()
        self.k = k

    def forward(self, x, outs):
        outs.append(x * self.k)
        return x + self.k


class BlocksByLoop(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(1.0), Block(-2.0)])

    def forward(self, x, outs):
        for blk in self.blocks:
            if x.sum() > 0:
                x = blk(x, outs)
        return x


class BlocksByIndex(BlocksByLoop):
    def forward(self, x, outs):
        for i in range(len(self.blocks)):
            if x.sum() > 0:
                x = self.blocks[i](x, outs)
            else:
                x = x + 3.0
        return x


class BlocksOnBothSides(BlocksByLoop):
    def forward(self, x, outs):
        for i in range(len(self.blocks)):
            if x.sum() > 0:
                x = self.blocks[i](x, outs)
            else:
                x = self.blocks[1 - i](x * 0.5, outs)
        return x


class Holder(torch.nn.Module):
    def __init__(self, stack: torch.nn.Module) -> None:
        super().__init__()
        self.stack = stack

    def forward(self, x):
        outs = []
        h = self.stack(x, outs)
        return outs, len(outs), h


@pytest.mark.parametrize("host,stack", [("auto", BlocksByLoop), ("dispatch", BlocksByLoop),
                                        ("auto", BlocksByIndex), ("dispatch", BlocksByIndex),
                                        ("staged", BlocksOnBothSides)])
def test_appends_of_module_list_blocks_in_a_tensor_branch_reach_the_callers_list(host: str, stack) -> None:
    model = Holder(stack()).eval()
    jm = dycl_jax.to_jax(model, (torch.ones(2, 4),), host=host)
    for x in _inputs():
        _same(model(x), jm(x))
    assert {bool(x.sum() > 0) for x in _inputs()} == {True, False}  # both sides of the first `if`
    assert jm.host == ("staged" if host == "staged" else "dispatch")


def test_staged_refuses_a_module_list_block_appending_on_one_side_only() -> None:
    with pytest.raises(dycl_jax.DyclError, match="outs") as err:
        dycl_jax.to_jax(Holder(BlocksByIndex()).eval(), (torch.ones(2, 4),), host="staged")
    assert err.value.location.file == __file__
