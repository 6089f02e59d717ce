"""A staged island inside a dispatch host outputs only the names read after it: a name it may
write that nothing reads later (read only before it) is neither an output nor an input, so the
host need not hold a value for it (fuzz seed 681515646 crashed conversion with UnboundLocalError
for such a name). Results equal the original torch model under host="dispatch" and "auto"."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import dycl_jax
from differential import assert_same


class EarlyReturnAlias(nn.Module):
    """The fuzz shape: `v` read into an alias and a view, an early return, then a Python-decided
    reassignment of `v` that nothing reads."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        v = h * 0.5
        a = v
        w = v.view(-1)
        s = 0
        if h.sum() > 0.0:
            return h * 2.0, a, w * 1.0
        h = torch.relu(self.lin(h)) - 0.1
        if s > 1:
            v = h * 0.5
        return h, a, w


class DeadTensorBranch(nn.Module):
    """A tensor `if` writes `scale` (read only before it), with a `.item()` read after it that
    keeps the method on the dispatch host."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        scale = h.abs().mean()
        h = self.lin(h) * scale
        for i in range(2):
            if h[0, i] > 0:
                scale = h * i
                h = h + 1
        k = int((h > 0).sum().item())
        return h[:, : k + 1], k


class DeadInLoop(nn.Module):
    """The same in a host loop over `.tolist()` values: `tmp` is read at the top of each
    iteration and may be rewritten at its end, after a tensor `if`."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h, steps):
        tmp = h
        outs = []
        for n in steps.tolist():
            h = self.lin(h + tmp * 0)
            tmp = h
            if h.sum() > n:
                h = h * 2
                tmp = h - 1
            outs.append(h)
        return torch.cat(outs), tmp


class UnsetInHostLoop(nn.Module):
    """A name (`hh`) assigned only on a Python-decided path no call takes, inside a host loop
    (after a tensor `while` that appends to a list): a part's output left unassigned (fuzz seed
    399509737 crashed the first capture waiting on it, an UnboundLocalError of ours)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        outs = []
        n = 0
        while h.sum() < 1.0 and n < 3:
            outs.append(h.sum())
            h = h + 0.5
            n += 1
        s = 0
        for j in range(2):
            h = torch.sigmoid(h)
            if s > 0:
                hh = h.half(); hh = hh * hh.mean(); h = hh.float() * 0.5 + h  # noqa: E702
            else:
                h = self.lin(h)
        return h, len(outs)


def _cases(cls) -> list[tuple]:
    g = torch.Generator().manual_seed(4)
    xs = [torch.randn(1, 6, generator=g) * (0.3 + k % 4) for k in range(8)]
    if cls is DeadInLoop:
        return [(x, torch.tensor([k % 3 - 1, 1, -2])) for k, x in enumerate(xs)]
    return [(x,) for x in xs]


@pytest.mark.parametrize("host", ["dispatch", "auto"])
@pytest.mark.parametrize("cls", [EarlyReturnAlias, DeadTensorBranch, DeadInLoop, UnsetInHostLoop])
def test_names_dead_after_an_island_are_not_its_outputs(cls, host):
    torch.manual_seed(0)
    model = cls().eval()
    cases = _cases(cls)
    jm = dycl_jax.to_jax(model, cases[0], host=host)
    for k, args in enumerate(cases):
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*(a.numpy() for a in args)), f"{cls.__name__} input {k}")
