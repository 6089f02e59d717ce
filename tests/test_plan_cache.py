"""Eager traces reuse a construct's dry-run plan only for calls whose plan would be the same."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from dycl_jax.rewrite import operators, plan_cache
from dycl_jax.rewrite.api import run_torch_trace
from differential import assert_same  # pytest puts tests/ on sys.path


class PythonValue(nn.Module):
    """The output `z` is the Python value `k` on both paths: a constant of the plan."""

    def forward(self, x, k: int):
        if x.sum() > 0:
            y = x + 1
            z = k
        else:
            y = x - 1
            z = k
        return y * z, z


class ShapeStructure(nn.Module):
    """The output list has one tensor per row: its structure follows the input's shape."""

    def forward(self, x):
        if x.sum() > 0:
            parts = list(x.unbind(0))
        else:
            parts = list((-x).unbind(0))
        return parts


class AttributeStructure(nn.Module):
    """The output tuple's length is a Python attribute of the model, changed between calls."""

    def __init__(self) -> None:
        super().__init__()
        self.pieces = 2

    def forward(self, x):
        if x.sum() > 0:
            out = tuple(x * i for i in range(self.pieces))
        else:
            out = tuple(x - i for i in range(self.pieces))
        return out


def _x(rows: int, sign: float) -> torch.Tensor:
    return sign * (torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3) + 1)


def _dry_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    plan_cache.clear()  # the plans are process-wide: count from an empty table
    runs: list[int] = []
    real = operators._dry_plan

    def counted(*args):
        runs.append(1)
        return real(*args)
    monkeypatch.setattr(operators, "_dry_plan", counted)
    return runs


def _check(model: nn.Module, args: tuple, where: str) -> None:
    with torch.no_grad():
        want = model(*args)
    got, decisions = run_torch_trace(model, "forward", args)
    assert_same(want, got, where)
    assert decisions and decisions[0][1] == bool(args[0].sum() > 0), where


def test_equal_signature_reuses_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _dry_runs(monkeypatch)
    model = ShapeStructure()
    _check(model, (_x(2, 1.0),), "first call")
    assert len(runs) == 1
    _check(model, (_x(2, -1.0),), "same signature, other path")  # other values: only the decision differs
    assert len(runs) == 1


def test_python_value_is_part_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _dry_runs(monkeypatch)
    model = PythonValue()
    for k, sign in [(2, 1.0), (3, 1.0), (3, -1.0), (2, -1.0)]:
        _check(model, (_x(2, sign), k), f"k={k} sign={sign}")
    assert len(runs) == 2  # one plan per value of k


def test_shape_is_part_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _dry_runs(monkeypatch)
    model = ShapeStructure()
    for rows, sign in [(2, 1.0), (3, -1.0), (2, -1.0), (3, 1.0)]:
        _check(model, (_x(rows, sign),), f"rows={rows} sign={sign}")
    assert len(runs) == 2


def test_module_attribute_is_part_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = _dry_runs(monkeypatch)
    model = AttributeStructure()
    for pieces, sign in [(2, 1.0), (3, 1.0), (3, -1.0), (2, -1.0)]:
        model.pieces = pieces
        _check(model, (_x(2, sign),), f"pieces={pieces} sign={sign}")
    assert len(runs) == 2
