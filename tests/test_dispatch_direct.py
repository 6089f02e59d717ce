"""A method whose whole body is one tail island: once its program is compiled for a signature,
the dispatch host calls that program directly (no host Python around it, as none would decide
anything), with the original torch model's results on every exit; traced calls, new shapes,
defaults and train mode still take the full way."""
from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import dycl_jax
from dycl_jax.host import whole
from dycl_jax.host.dispatch import _MISSED, DispatchHost
from dycl_jax.rewrite.api import run_torch_trace
from differential import assert_same


class ListExit(nn.Module):
    """Early exit over blocks with a Python list of logits and a Python-int exit id."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.heads = nn.ModuleList(nn.Linear(8, 3) for _ in range(3))

    def forward(self, x):
        outs = []
        h = x
        for i, (blk, head) in enumerate(zip(self.blocks, self.heads)):
            h = torch.relu(blk(h)) + h
            outs.append(head(h))
            if outs[-1].softmax(-1).max() > 0.6:
                return outs[-1], i
        return torch.stack(outs).mean(0), len(outs)


class FlagLoop(nn.Module):
    """The same decisions written with a tensor flag, `.item()` in the test and a while loop."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(8, 8)
        self.halt = nn.Linear(8, 1)

    def forward(self, x, budget):
        done = torch.tensor(0)
        steps = 0
        while steps < 4 and done.item() == 0:
            x = torch.tanh(self.cell(x)) * budget
            if self.halt(x).sum() > 0.1:
                done = torch.tensor(1)
            steps += 1
        return x, steps


class Defaults(nn.Module):
    """A parameter with a default: a call that leaves it out takes the full way."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, scale=2.0):
        y = self.fc(x)
        if y.sum() > 0:
            return y * scale
        return y - 100


def _inputs(n: int, batch: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return [torch.randn(batch, 8, generator=g) * (0.1 + 2.5 * (k % 5) / 4) for k in range(n)]


def _host(jm) -> DispatchHost:
    host = jm._call.func.__self__ if isinstance(jm._call, functools.partial) else jm._call  # train mode: train_call
    assert isinstance(host, DispatchHost)
    return host


def _count_direct(jm, monkeypatch, quick: list[int] | None = None) -> list[int]:
    """[calls the host answered directly, calls that took the full way] from now on. Direct: by
    the program a signature compiled, called straight from the tensors (host/whole.py; counted in
    `quick` too), or on `_direct`'s way."""
    host = _host(jm)
    seen = [0, 0]
    quick = [0] if quick is None else quick
    direct, quick_call = host._direct, host._quick.call

    def counted(args, tensors):
        out = direct(args, tensors)
        seen[out is _MISSED] += 1
        return out

    def counted_quick(*args):
        out = quick_call(*args)
        if out is not whole.MISSED:
            seen[0] += 1
            quick[0] += 1
        return out
    monkeypatch.setattr(host, "_direct", counted)
    monkeypatch.setattr(host._quick, "call", counted_quick)
    return seen


def _compare(model: nn.Module, jm, cases: list[tuple], kind) -> set:
    """Every case through torch and `jm`, equal; the set of `kind(torch's output)` seen."""
    kinds = set()
    with torch.no_grad():
        for k, args in enumerate(cases):
            want = model(*args)
            kinds.add(kind(want))
            assert_same(want, jm(*(a.numpy() for a in args)), f"input {k}")
    return kinds


def test_whole_body_island_is_called_directly_with_torch_results(monkeypatch):
    torch.manual_seed(10)  # the weights decide the exits: with these, the inputs take every one
    model = ListExit().eval()
    xs = _inputs(24)
    jm = dycl_jax.to_jax(model, (xs[0],), host="dispatch")
    quick = [0]
    seen = _count_direct(jm, monkeypatch, quick)
    exits = _compare(model, jm, [(x,) for x in xs], lambda want: want[1])
    assert exits == {0, 1, 2, 3}, exits  # every exit, the fallback included
    assert seen == [len(xs), 0], seen  # compiled at conversion: every call direct
    assert quick == [len(xs) - 1], quick  # the first on `_direct`'s way, which learns the quick one
    # a new batch size compiles on the full way, then goes direct too
    for k, x in enumerate(_inputs(3, batch=2)):
        with torch.no_grad():
            assert_same(model(x), jm(x.numpy()), f"batch 2 input {k}")
    assert seen == [len(xs) + 2, 1], seen
    # torch tensors: the same way (the call's signature hands them to the host as numpy)
    with torch.no_grad():
        for k, x in enumerate(xs[:4]):
            assert_same(model(x), jm(x), f"torch input {k}")
    assert quick == [len(xs) - 1 + 1 + 4], quick


def test_a_traced_call_takes_the_full_way_and_records_decisions(monkeypatch):
    torch.manual_seed(10)
    model = FlagLoop().eval()
    budget = torch.tensor(1.5)
    xs = _inputs(12)
    jm = dycl_jax.to_jax(model, (xs[0], budget), host="dispatch")
    seen = _count_direct(jm, monkeypatch)
    steps = set()
    for k, x in enumerate(xs):
        with torch.no_grad():
            want = model(x, budget)
        steps.add(want[1])
        assert_same(want, jm(x.numpy(), budget.numpy()), f"input {k}")
        _, want_trace = run_torch_trace(model, "forward", (x, budget))
        got, trace = jm.trace(x.numpy(), budget.numpy())
        assert [(d[0], bool(d[1])) for d in trace] == [(d[0], bool(d[1])) for d in want_trace], f"input {k}"
        assert_same(want, got, f"traced input {k}")
    assert len(steps) >= 2, steps
    assert seen == [len(xs), 0], seen  # jm.trace never went through _direct


def test_defaults_and_train_mode_take_the_full_way(monkeypatch):
    torch.manual_seed(10)
    model = Defaults().eval()
    xs = _inputs(8)
    jm = dycl_jax.to_jax(model, (xs[0],), host="dispatch")
    seen = _count_direct(jm, monkeypatch)
    signs = _compare(model, jm, [(x,) for x in xs], lambda want: bool(want.sum() > 0))
    assert len(signs) == 2, signs  # both returns
    # one argument of two: the island takes both, so the host runs the method itself each time
    assert seen == [0, len(xs)], seen

    trained = dycl_jax.to_jax(ListExit().train(), (xs[0],), host="dispatch", train=True)
    assert _host(trained)._whole is not None
    trained_seen = _count_direct(trained, monkeypatch)
    trained(xs[1].numpy())
    assert trained_seen == [0, 0], trained_seen  # a train-mode call draws keys: never direct


class VarArgs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, *xs):
        y = self.fc(xs[0])
        if y.sum() > 0:
            return y
        return y * 3


class KeywordOnly(VarArgs):
    def forward(self, x, *, k=1):
        y = self.fc(x)
        if y.sum() > 0:
            return y * k
        return y * 3


@pytest.mark.parametrize("cls", [VarArgs, KeywordOnly])
def test_no_direct_call_where_parameters_are_not_all_positional(cls):
    torch.manual_seed(10)
    model = cls().eval()
    xs = _inputs(6)
    jm = dycl_jax.to_jax(model, (xs[0],), host="dispatch")
    assert _host(jm)._whole is None
    with torch.no_grad():
        for k, x in enumerate(xs):
            assert_same(model(x), jm(x.numpy()), f"input {k}")

