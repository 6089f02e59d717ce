"""A tensor `while` whose body updates a tensor through a container (`xs[0].add_(h)`,
`d["acc"] += h`) while the same tensor is read under another name (`v`, with `xs = [v]`): torch
changes `v` on every iteration. The staged loop carried the list and `v` as separate values, so
from the second iteration on `v` missed the update: a silent wrong answer on every host (fuzz
seed 399509941, off by 334). Staging now refuses such a loop with a located StagedAliasError and
`auto` runs it on the dispatch host, equal to torch; a loop that only replaces a container's
item still stages."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import dycl_jax
from differential import assert_same
from dycl_jax.errors import StagedAliasError


class ListElement(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, h):
        v = self.lin(h) * 0.5
        xs = [v]
        n = torch.zeros((), dtype=torch.long)
        while h.sum() > 2.0 and n < 3:
            n = n + 1
            xs[0].add_(h)
            h = h + v
        return h, xs[0] * 1.0


class DictElement(ListElement):
    """The update written `d["acc"] += h` on a dict, the alias read after the loop only."""

    def forward(self, h):
        acc = self.lin(h)
        d = {"acc": acc}
        n = 0
        while h.sum() > 2.0 and n < 3:
            n += 1
            d["acc"] += h
            h = h * 0.9
        return h, acc * 1.0, n


class ReplacesElement(ListElement):
    """A dict item replaced (`d["h"] = ...`), no tensor updated in place, while `h`, the tensor it
    held at first, is read: the loop stays one program."""

    def forward(self, h):
        d = {"h": h}
        n = torch.zeros((), dtype=torch.long)
        while h.sum() > 2.0 and n < 3:
            n = n + 1
            d["h"] = self.lin(d["h"]) + h * 0.1
            h = h * 0.9
        return d["h"], h


def _cases() -> list[tuple]:
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(2, 6, generator=g) + (k % 4) * 0.5,) for k in range(10)]


@pytest.mark.parametrize("cls", [ListElement, DictElement])
def test_an_update_through_a_container_reaches_the_other_name(cls):
    torch.manual_seed(0)
    model = cls().eval()
    cases = _cases()
    with pytest.raises(StagedAliasError) as info:
        dycl_jax.to_jax(model, cases[0], host="staged")
    assert info.value.location is not None and info.value.location.file == __file__
    jm = dycl_jax.to_jax(model, cases[0])
    assert jm.host == "dispatch"
    iterations = set()
    for k, args in enumerate(cases):
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*(a.numpy() for a in args)), f"{cls.__name__} input {k}")
        iterations.add(len(jm.trace(*(a.numpy() for a in args))[1]))
    # inputs that skip the loop and inputs that run its body at least twice (where `v` went stale)
    assert min(iterations) == 1 and max(iterations) >= 3, iterations


def test_a_loop_that_replaces_an_element_still_stages():
    torch.manual_seed(0)
    model = ReplacesElement().eval()
    cases = _cases()
    jm = dycl_jax.to_jax(model, cases[0])
    assert jm.host == "staged"
    for k, args in enumerate(cases):
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*(a.numpy() for a in args)), f"input {k}")
