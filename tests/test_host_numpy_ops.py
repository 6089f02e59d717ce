"""numpy forms of small ATen ops in host statements (host/numpy_ops.py): each gives torch's own
result (values and dtype) or declines, op by op against torch on mixed dtypes, scalars beyond
int32 and out-of-range ints; and a converted model whose host statement takes int64 values above
2**31 through them matches the original torch model."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import dycl_jax
from dycl_jax.host.dispatch import READ
from dycl_jax.host import numpy_ops

aten = torch.ops.aten

_INTS = torch.tensor([0, 3, -7, 2**31 + 5, -(2**40) - 1, 2**62])
_FLOATS = torch.tensor([0.1, -2.5, float("nan"), float("inf"), 3.0, 1e-8])
_OPERANDS = [
    (_INTS, torch.tensor([0, 3, 7, 2**31 + 4, -(2**40) - 1, 1])),
    (_INTS, 2**31 + 5), (_INTS, 3), (_INTS, 2.5), (_INTS, 2147483648.5), (_INTS, True),
    (_INTS.int() if False else torch.tensor([1, 2, 3, 4, 5, 6], dtype=torch.int32), 2**40),  # beyond int32: declined
    (torch.tensor([1, 200, 3, 4, 5, 6], dtype=torch.uint8), 300),  # beyond uint8: declined
    (torch.tensor([1, 200, 3, 4, 5, 6], dtype=torch.uint8), torch.tensor([1, -1, 3, 4, 5, 6], dtype=torch.int8)),
    (_FLOATS, 0.1), (_FLOATS, torch.tensor(0.1, dtype=torch.float64)), (_FLOATS, _FLOATS.flip(0)),
    (_FLOATS, 16777217), (_FLOATS.double(), _FLOATS), (_FLOATS > 0, _FLOATS < 1),
    (_FLOATS.reshape(2, 3), torch.tensor([0.1, 3.0, 1e-8])),  # broadcast
]
_BINARY = [getattr(aten, name).Tensor for name in ("eq", "ne", "lt", "le", "gt", "ge", "add", "sub", "mul")] + \
    [getattr(aten, name).Scalar for name in ("eq", "ne", "lt", "le", "gt", "ge", "add", "sub", "mul")]


def _same(expected: object, got: object, what: str) -> None:
    if isinstance(expected, (list, tuple)):
        assert type(got) is list and len(got) == len(expected), what
        for e, g in zip(expected, got):
            _same(e, g, what)
        return
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == expected.dtype and got.shape == expected.shape, \
            (what, expected, got)
        assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(expected)) \
            and torch.equal(got.isnan(), expected.isnan()), (what, expected, got)
        return
    assert type(got) is type(expected), (what, expected, got)
    assert got == expected or math.isnan(expected) and math.isnan(got), (what, expected, got)


def _check(func: object, args: tuple, kwargs: dict | None = None) -> bool:
    """numpy's result equals torch's where numpy gives one; whether it did."""
    kwargs = kwargs or {}
    try:
        expected = func(*args, **kwargs)
    except (RuntimeError, TypeError, IndexError):
        return False  # torch refuses these operands: nothing to match
    got = numpy_ops.run(func, args, kwargs)
    if got is None:
        return False
    _same(expected, got, f"{func}{tuple(type(a).__name__ for a in args)}")
    if isinstance(got, torch.Tensor):
        for a in args:
            if isinstance(a, torch.Tensor):
                assert got.untyped_storage().data_ptr() != a.untyped_storage().data_ptr(), "a view of an input"
    return True


def test_binary_ops_match_torch_or_decline() -> None:
    taken = 0
    for func in _BINARY:
        for a, b in _OPERANDS:
            if func._overloadname == "Scalar" and isinstance(b, torch.Tensor) or \
                    func._overloadname == "Tensor" and not isinstance(b, torch.Tensor) and "add" not in str(func) \
                    and "sub" not in str(func) and "mul" not in str(func):
                continue
            taken += _check(func, (a, b))
    assert taken >= 100, taken  # the usual cases take the numpy form
    # beyond the promoted dtype torch compares by value: numpy declines, JAX computes it
    assert numpy_ops.run(aten.gt.Scalar, (torch.tensor([5], dtype=torch.int32), 2**40), {}) is None
    assert numpy_ops.run(aten.lt.Scalar, (torch.tensor([1], dtype=torch.uint8), 300), {}) is None
    assert numpy_ops.run(aten.add.Tensor, (_INTS, _INTS), {"alpha": 2}) is None


def test_item_logical_reductions_and_row_picks_match_torch() -> None:
    for t in (torch.tensor(2**40 + 3), torch.tensor([0.1]), torch.tensor(True), torch.tensor(7, dtype=torch.uint8),
              torch.tensor(1.5, dtype=torch.float16), torch.tensor([[3 + 4j]], dtype=torch.complex64)):
        assert _check(aten._local_scalar_dense.default, (t,)), t
    masks = [_FLOATS > 0, _INTS, torch.tensor([[0, 2], [1, 0]], dtype=torch.uint8)]
    for m in masks:
        assert _check(aten.logical_not.default, (m,))
        assert _check(aten.any.default, (m,)) and _check(aten.all.default, (m,))
        assert _check(aten.nonzero.default, (m,))
        assert _check(aten.unbind.int, (m,))
        assert _check(aten.select.int, (m, 0, -1))
        assert _check(aten.slice.Tensor, (m, 0, 1, 9223372036854775807))
    assert _check(aten.logical_and.default, (_FLOATS, _INTS)) and _check(aten.logical_xor.default, (_INTS, _FLOATS))
    assert _check(aten.unbind.int, (_FLOATS.reshape(2, 3), 1)) and _check(aten.slice.Tensor, (_INTS, 0, -4, None, 2))
    assert numpy_ops.run(aten.select.int, (_INTS, 0, 6), {}) is None  # out of range: the JAX path raises torch's way
    assert numpy_ops.run(aten._local_scalar_dense.default, (torch.tensor(1.0, dtype=torch.bfloat16),), {}) is None


class BigIds(torch.nn.Module):
    """Token ids offset beyond int32, read back as Python ints in a host statement."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x, ids):
        big = ids + 4_000_000_000
        first = int((big > 4_000_000_002).nonzero()[0, 0].item())  # data-dependent: a host statement
        top = big[first].item()
        return self.lin(x[:first + 1]), top, first


def test_host_statement_on_int64_beyond_int32_uses_numpy_and_matches_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    for func in (aten.nonzero.default, aten._local_scalar_dense.default, aten.gt.Scalar):
        form = numpy_ops.FORMS[func]
        monkeypatch.setitem(numpy_ops.FORMS, func,
                            lambda args, kwargs, form=form, name=str(func): calls.append(name) or form(args, kwargs))
    model = BigIds().eval()
    x = torch.randn(5, 3)
    cases = [(x, torch.tensor([0, 1, 5, 2, 9])), (x, torch.tensor([3, 0, 0, 0, 0])), (x, torch.tensor([1, 2, 0, 3, 8]))]
    jm = dycl_jax.to_jax(model, cases[0], host="dispatch")
    for args in cases:
        calls.clear()
        with torch.no_grad():
            out, top, first = model(*args)
        got, got_top, got_first = jm(*args)
        assert type(got_top) is int and got_top == top > 2**31 and got_first == first, (top, got_top, first, got_first)
        assert got.shape == out.shape and np.allclose(np.asarray(got), out.numpy(), atol=1e-5)
        assert "aten.nonzero.default" in calls, calls
    assert not jm.report().torch_statements
    # the two `.item()` reads (of int64 beyond int32) are read with numpy too (host/reads.py)
    assert sum(READ in p.cache.values() for st in jm._fn.regions.values() for p in st.parts) == 2


class MaskOut(torch.nn.Module):
    """Host statements' results returned as they are, one of them int64 beyond int32."""

    def forward(self, x, ids):
        pos = x[x > 0]
        big = (ids + 4_000_000_000)[ids > 1]
        return pos, big, pos.sum() * 2


def test_host_statement_results_pass_on_as_numpy_and_return_as_torch_gives_them() -> None:
    import jax

    model = MaskOut().eval()
    g = torch.Generator().manual_seed(0)
    cases = [(torch.randn(7, generator=g), torch.tensor([0, 3, 1, 9, 2])) for _ in range(3)]
    jm = dycl_jax.to_jax(model, cases[0], host="dispatch")
    for args in cases:
        with torch.no_grad():
            pos, big, total = model(*args)
        got_pos, got_big, got_total = jm(*args)
        assert isinstance(got_pos, jax.Array) and isinstance(got_total, jax.Array)  # as the staged host returns them
        assert np.array_equal(np.asarray(got_pos), pos.numpy()) and np.allclose(np.asarray(got_total), total.numpy())
        assert np.asarray(got_big).dtype == np.int64 and np.array_equal(np.asarray(got_big), big.numpy())
    assert not jm.report().torch_statements
