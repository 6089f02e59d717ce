"""Helper functions of another file that keep a count in a global of their own (for test_global_helpers.py)."""
from __future__ import annotations

import torch

_CALLS = {"n": 0}
SCALE = 2.0  # only read: a constant every call sees alike


def reset() -> None:
    _CALLS["n"] = 0


def bump(h: torch.Tensor) -> torch.Tensor:
    _CALLS["n"] += 1
    return h


def count() -> int:
    return _CALLS["n"]


def scaled(h: torch.Tensor) -> torch.Tensor:
    return h * SCALE
