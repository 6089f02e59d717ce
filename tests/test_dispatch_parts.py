"""How the dispatch host cuts a region that torch.export refuses: at the refused statement, so the
statements around it stay whole compiled parts (not the pieces a search by halves leaves), with
results equal to the original torch model."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import dycl_jax
from dycl_jax.host.dispatch import EAGER, Compiled
from differential import assert_same


class ListAfterWork(nn.Module):
    """Four tensor statements, then lengths read into a list (not a bare read: a host statement), then
    a slice by their maximum."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x, lengths):
        h = self.a(x)
        h = torch.relu(h)
        g = self.b(h)
        g = g * 2
        lens = [v - 1 for v in lengths.tolist()]
        out = g[: max(lens)]
        return out, lens


class ItemBetween(nn.Module):
    """The same shape of program with an `.item()` count in the middle, written with reused names."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        y = self.a(x)
        y = y - y.mean()
        y = torch.tanh(y)
        k = max(int((y > 0).sum().item()), 1)
        y = y[:k]
        return y * 3, k


def _inputs(name: str, n: int) -> list[tuple]:
    g = torch.Generator().manual_seed(3)
    if name == "list":
        return [(torch.randn(6, 4, generator=g), torch.randint(2, 7, (3,), generator=g)) for _ in range(n)]
    return [(torch.randn(6, 4, generator=g),) for _ in range(n)]


def _parts(jm) -> list[tuple[int, int, str]]:
    """(first, stop, kind) of every part of the method's regions, kind "compiled" or "host"."""
    out = []
    for st in jm._fn.regions.values():
        for p in st.parts:
            kinds = {"compiled" if isinstance(e, Compiled) else "host" if e == EAGER else str(e)
                     for e in p.cache.values()}
            out.append((p.first, p.stop, "/".join(sorted(kinds))))
    return out


@pytest.mark.parametrize("name, cls, leading", [("list", ListAfterWork, 4), ("item", ItemBetween, 3)])
def test_statements_before_a_host_value_stay_one_compiled_part(name, cls, leading) -> None:
    torch.manual_seed(0)
    model = cls().eval()
    cases = _inputs(name, 8)
    jm = dycl_jax.to_jax(model, cases[0], host="dispatch")
    seen = set()
    for case in cases:
        with torch.no_grad():
            want = model(*case)
        got = jm(*(np.asarray(t) for t in case))
        assert_same(want, got, f"{name} {case}", rtol=1e-5, atol=1e-6)
        seen.add(repr(want[1]))
    assert len(seen) > 2, "the inputs should give several lengths/counts"
    parts = _parts(jm)
    # the leading tensor statements: one program, whichever way the search went
    assert (0, leading, "compiled") in parts, parts
    # the statement reading a Python value from tensor data: alone, on the host
    assert (leading, leading + 1, "host") in parts, parts
