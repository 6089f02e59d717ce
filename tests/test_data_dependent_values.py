"""Ops whose answer is a Python value read from data (`torch.allclose` / `torch.equal` as bools,
`narrow` / `tensor_split` at `.item()` / `.tolist()` points) through `host="auto"`, against torch
on inputs where the answer changes.

How they run: the statement that turns data into a Python value (`.item()`, `.tolist()`, and
`torch.allclose` / `torch.equal`, whose result is a Python bool) runs on the dispatch host,
computed by JAX ops on concrete arrays (host/jax_ops.py); everything else, `narrow` and
`tensor_split` at those points included, runs in jitted JAX regions. The tests pin that split,
so a lowering silently replaced by torch would fail."""
from __future__ import annotations

import numpy as np
import torch

import dycl_jax
from differential import assert_same


class CloseGate(torch.nn.Module):
    """A branch on torch.allclose, as a refinement loop's convergence test is written."""

    def forward(self, x, y):
        if torch.allclose(x, y, atol=1e-3):
            return x * 2
        return x - y


class EqualFlag(torch.nn.Module):
    """torch.equal as a Python bool used as a number, and a second test with `not`."""

    def forward(self, a, b, x):
        same = torch.equal(a, b)
        out = x * float(same) + 1
        if not torch.equal(a[:1], b[:1]):
            out = out - 5
        return out


class NarrowAt(torch.nn.Module):
    """narrow at an offset read with .item(); the length from a reduction read as an int."""

    def forward(self, x, start, lengths):
        s = int(start.item())
        window = x.narrow(1, s, 2)
        n = int(lengths.max().item())
        head = x.narrow(1, 0, n)
        return window * 3, head.sum(1)


class SplitAt(torch.nn.Module):
    """tensor_split at points from .tolist(), results reduced in a Python list."""

    def forward(self, x, cuts):
        points = cuts.tolist()
        parts = torch.tensor_split(x, points, dim=1)
        sums = [p.sum(dim=1) for p in parts]
        k = int(cuts[0].item())
        first, rest = x.tensor_split([k], dim=0)
        return torch.stack(sums, 0), first.mean(0), rest.shape[0]


# the only statements the host may run in torch: those that read data as a Python value
_HOST_READS = (".item()", ".tolist()", "torch.allclose(", "torch.equal(")


def _run(model: torch.nn.Module, cases: list[tuple]) -> dycl_jax.JaxModel:
    jm = dycl_jax.to_jax(model, cases[0])
    assert jm.host == "dispatch", jm.host  # the answer is a Python value: auto falls back to dispatch
    answers = set()
    for args in cases:
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*args), f"{type(model).__name__}{[tuple(a.shape) for a in args]}")
        answers.add(repr(want))
    assert len(answers) == len(cases), "the inputs were chosen so that every answer differs"
    for statement in jm.report().host_statements:
        code = statement.split("`")[1]
        assert any(r in code for r in _HOST_READS), f"a host statement, not a jitted region: {statement}"
    assert not jm.report().torch_statements, jm.report().torch_statements  # host statements too are JAX's
    return jm


def test_allclose_as_a_branch_condition() -> None:
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    _run(CloseGate(), [(x, x + 1e-5), (x, x + 0.5), (x * 2, x * 2 - 2e-4)])


def test_equal_as_a_number_and_under_not() -> None:
    a = torch.arange(6).reshape(2, 3)
    b = a.clone()
    b2 = a.clone()
    b2[1, 2] = 0
    b3 = a + 1
    x = torch.ones(2, 3)
    _run(EqualFlag(), [(a, b, x), (a, b2, x), (a, b3, x)])


def test_narrow_at_data_dependent_offsets_and_lengths() -> None:
    x = torch.arange(24.0).reshape(2, 12)
    _run(NarrowAt(), [(x, torch.tensor(0), torch.tensor([3, 1])), (x, torch.tensor(10), torch.tensor([12, 12]))])


def test_tensor_split_at_data_dependent_points() -> None:
    x = torch.randn(4, 9, generator=torch.Generator().manual_seed(1))
    jm = _run(SplitAt(), [(x, torch.tensor([1, 4])), (x, torch.tensor([3, 3]))])
    out = jm(x.numpy(), np.array([0, 9]))  # empty first and last parts
    assert_same(SplitAt()(x, torch.tensor([0, 9])), out, "empty parts")
