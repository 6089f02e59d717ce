"""One Python list under two names stays one list through converted code, as in Python: an
append inside a region, an island, a tensor branch or a submodule reaches every name holding
it (`saved = alphas; ... alphas.append(a); ... torch.stack(saved)`). Checked against the
ORIGINAL torch model under host="dispatch" and host="auto" (which stages what it can)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import dycl_jax
from differential import assert_same  # pytest puts tests/ on sys.path


class TensorBranch(nn.Module):
    """`saved = alphas`, appends in both arms of a tensor `if` over a ModuleList, `saved` read."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(6, 6) for _ in range(3))

    def forward(self, x):
        alphas = []
        saved = alphas
        h = x
        for blk in self.blocks:
            h = torch.relu(blk(h)) + h
            a = h.mean()
            if a > 0.1:
                alphas.append(a)
            else:
                alphas.append(-a * 2)
        return h, len(saved), torch.stack(saved).sum()


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, h, log):
        p = torch.sigmoid(self.fc(h)).mean()
        log.append(p)
        if p > 0.5:
            return h * p
        return h - p


class Submodules(nn.Module):
    """A list passed to submodules that append to it and branch on a tensor; an alias read."""

    def __init__(self) -> None:
        super().__init__()
        self.gates = nn.ModuleList(Gate() for _ in range(3))

    def forward(self, x):
        log = []
        keep = log
        h = x
        for g in self.gates:
            h = g(h, log)
        flag = torch.tensor(1)
        return h * flag, torch.stack(keep), len(log)


class NumpyWhile(nn.Module):
    """`.item()` values reduced by numpy, appended in a tensor `while`; the alias appended to and
    summed after."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        scores = []
        history = scores
        h = self.fc(x)
        k = 0
        while k < 4 and h.norm() > 1.0:
            h = h * 0.5
            scores.append(float(np.float32(h.norm().item())))
            k += 1
        history.append(0.5)
        return h, sum(history), len(scores)


class BothNames(nn.Module):
    """Appends through both names, one in a tensor branch; the loop name `i` reused."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        outs = []
        also = outs
        h = x
        for i in range(3):
            h = torch.tanh(self.fc(h))
            if h.sum() > 0:
                also.append(h.sum())
            outs.append(h.mean())
        for i in range(len(also)):
            h = h + also[i]
        return h, len(outs), torch.stack(also)


# (host="auto" picks dispatch for NumpyWhile and BothNames: one run each covers both)
@pytest.mark.parametrize("host, model", [("dispatch", TensorBranch), ("auto", TensorBranch), ("dispatch", Submodules),
                                         ("auto", Submodules), ("auto", NumpyWhile), ("dispatch", BothNames)])
def test_a_list_under_two_names_stays_one_list(host, model) -> None:
    torch.manual_seed(0)
    model = model().eval()
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(2, 6, generator=g) * s for s in (0.3, 3, 0.1)]
    jm = dycl_jax.to_jax(model, (xs[0],), host=host)
    for k, x in enumerate(xs):
        with torch.no_grad():
            want = model(x)
        assert_same(want, jm(x), f"{type(model).__name__} input {k}")


class _OneLinear(nn.Module):
    """One Linear, and which path torch takes on an input (`taken`)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def taken(self, x) -> bool:
        return bool(self.fc(x).sum() > 0)


class HostBranchEdits(_OneLinear):
    """An `.item()` branch on the host: one arm assigns an element, the other extends; the
    alias made in the same region as the list is what is returned."""

    def forward(self, x):
        outs = [x, x * 2]
        saved = outs
        h = self.fc(x)
        if h.sum().item() > 0:
            outs[0] = h
        else:
            outs.extend([h * 3])
        return torch.stack(saved).sum(0), len(saved)


class RegionSubscript(_OneLinear):
    """`saved = outs` then `outs[k] = h` with `k` an int from `.item()`, all straight-line code."""

    def forward(self, x):
        outs = [x, x * 2]
        saved = outs
        h = self.fc(x)
        k = int(h.sum().item() > 0)
        outs[k] = h
        return torch.stack(saved).sum(0)


class AliasAppendedOnHost(_OneLinear):
    """`also = outs` (a chained alias), appended through `outs` in an `.item()` branch."""

    def taken(self, x) -> bool:
        return bool(self.fc(x).mean() > 0)

    def forward(self, x):
        outs = [x]
        saved = also = outs
        h = self.fc(x)
        if h.mean().item() > 0:
            outs.append(h)
        also.append(h * 0.5)
        return torch.cat(saved).sum(0), len(saved)


@pytest.mark.parametrize("model", [HostBranchEdits, RegionSubscript, AliasAppendedOnHost])
def test_a_list_aliased_inside_a_region_stays_one_list(model) -> None:
    # a region's outputs `outs` and `saved` used to come back as two lists (and a part given
    # both ran as a program taking two), so later changes through one name missed the other
    torch.manual_seed(0)
    model = model().eval()
    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(1, 6, generator=g) for _ in range(6)]
    jm = dycl_jax.to_jax(model, (xs[0],), host="dispatch")
    taken = set()
    for k, x in enumerate(xs):
        with torch.no_grad():
            want = model(x)
            taken.add(model.taken(x))
        assert_same(want, jm(x), f"{type(model).__name__} input {k}")
    assert taken == {True, False}, "both paths must be taken"
