"""Module attributes the method assigns inside data-dependent branches and loops (`self.exit_id =
1` in a branch, `self.steps += 1` in a `while`, `self.outputs.append(h)` before a `break`): the
converted model returns what torch returns on every path, under every host that converts it. An
attribute that only its own method reads is a local of the method (converters/self_attributes.py);
one that another module reads (`self.b1.open`) is refused by the staged host at its line and
runs in Python on the dispatch host. Before, the staged trace assigned such an attribute once
(`self.steps` came back 1 whatever the loop did) and `side_effects` dropped one read only by the
parent: silent wrong answers."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import dycl_jax
from dycl_jax.errors import DyclError
from differential import assert_same


class FlagAfterIf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.exit_id = 0

    def forward(self, x):
        h = self.fc(x)
        if h.sum() > 0:
            self.exit_id = 1
            h = h * 2
        else:
            self.exit_id = 2
        return h, self.exit_id


class ForCounter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(6, 6) for _ in range(4))
        self.used = 0

    def forward(self, x):
        self.used = 0
        for b in self.blocks:
            if x.sum() > 0:
                x = torch.relu(b(x))
                self.used += 1
        return x, self.used


class WhileCounter(nn.Module):
    """ACT-style: the step count lives on `self` and bounds the loop."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.steps = None

    def forward(self, x):
        self.steps = 0
        h = x
        while h.abs().sum() > 1.0 and self.steps < 5:
            h = torch.tanh(self.fc(h)) * 0.7
            self.steps += 1
        return h, self.steps


class ListOnSelf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(6, 6) for _ in range(3))
        self.outputs = None

    def forward(self, x):
        self.outputs = []
        h = x
        for b in self.blocks:
            h = torch.tanh(b(h))
            self.outputs.append(h)
            if h.sum() > 0.5:
                break
        return torch.stack(self.outputs).mean(0), len(self.outputs)


class ChildGate(nn.Module):
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(6, 6)
            self.gate = nn.Linear(6, 1)
            self.open = 0

        def forward(self, x):
            if self.gate(x).sum() > 0:
                self.open = 1
                return self.fc(x)
            self.open = 0
            return x

    def __init__(self) -> None:
        super().__init__()
        self.b1, self.b2 = self.Block(), self.Block()

    def forward(self, x):
        h = self.b2(self.b1(x))
        return h, self.b1.open + 2 * self.b2.open


def _inputs(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(1, 6, generator=g) * (0.3 + k % 4) for k in range(n)]


def _check(cls, host: str, n: int = 24) -> tuple[str, set]:
    """(the host chosen, the int outputs seen): every input equal to the original torch model's."""
    torch.manual_seed(0)
    model = cls().eval()
    twin = copy.deepcopy(model)
    xs = _inputs(n)
    jm = dycl_jax.to_jax(twin, (xs[0],), host=host)
    seen = set()
    with torch.no_grad():
        for k, x in enumerate(xs):
            want = model(x)
            seen.add(want[1])
            assert_same(want, jm(x), f"input {k}")
    return jm.host, seen


@pytest.mark.parametrize("host", ["auto", "staged", "dispatch"])
@pytest.mark.parametrize("cls, ints", [(FlagAfterIf, {1, 2}), (ForCounter, {0, 4}), (WhileCounter, None),
                                       (ListOnSelf, None)])
def test_attributes_assigned_in_branches_and_loops_match_torch(cls, ints, host):
    chosen, seen = _check(cls, host)
    assert chosen == ("dispatch" if host == "dispatch" else "staged"), chosen
    if ints is not None:
        assert seen == ints, seen
    else:
        assert len(seen) >= 3, seen  # several loop lengths


def test_an_attribute_another_module_reads_runs_on_the_dispatch_host():
    for host in ("auto", "dispatch"):
        chosen, seen = _check(ChildGate, host)
        assert chosen == "dispatch" and len(seen) >= 3, (host, chosen, seen)
    torch.manual_seed(0)
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(ChildGate().eval(), (_inputs(1)[0],), host="staged")
    err = info.value
    assert "`self.open` changes state kept outside" in str(err), str(err)
    assert err.location is not None and err.location.file == __file__ and err.location.code.strip() == "self.open = 1"


class PythonTestedChild(nn.Module):
    """The child's test is a Python int at run time (its parameter): the branch runs as Python
    when staged, so its assignment of `self.wide` (read by the parent) is exact and stages."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(6, 6)
            self.wide = 0

        def forward(self, x, k):
            if k > 1:
                self.wide = k
                return self.fc(x)
            self.wide = -1
            return x

    def __init__(self) -> None:
        super().__init__()
        self.b1 = self.Block()

    def forward(self, x):
        h = self.b1(x, x.shape[1])
        if h.sum() > 0:
            return h * 2, self.b1.wide
        return h, self.b1.wide


def test_an_assignment_under_a_python_test_at_run_time_stages():
    chosen, seen = _check(PythonTestedChild, "staged")
    assert chosen == "staged" and seen == {6}, (chosen, seen)


class ReadsAnotherFilesCount(nn.Module):
    """The parent reads `self.block.refinements`, assigned in a `while` of a block defined in
    another file (attribute_blocks.py): that file alone shows no other reader, the model's files do."""

    def __init__(self) -> None:
        from attribute_blocks import RefiningBlock

        super().__init__()
        self.block = RefiningBlock()

    def forward(self, x):
        h = self.block(x)
        return h, self.block.refinements


def test_a_reader_in_another_file_keeps_the_attribute():
    for host in ("auto", "dispatch"):
        chosen, seen = _check(ReadsAnotherFilesCount, host)
        assert chosen == "dispatch" and len(seen) >= 3, (host, chosen, seen)


class ChildGateOverH(ChildGate):
    """ChildGate with the block's input named `h`: an island's parameters are sorted (`h` before
    `self`), so its first parameter is not the method's `self`."""

    class Block(ChildGate.Block):
        def forward(self, h):
            if self.gate(h).sum() > 0:
                self.open = 1
                return self.fc(h)
            self.open = 0
            return h


def test_an_island_whose_first_parameter_is_not_self_still_refuses_the_store():
    chosen, seen = _check(ChildGateOverH, "dispatch")
    assert chosen == "dispatch" and len(seen) >= 3, (chosen, seen)
