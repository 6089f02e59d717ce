"""Differential test: PyTorch OpInfo float32 samples through to_jax, compared with eager torch."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # the helpers live next to this file, not in the package

from opinfo_entries import ORDINARY  # noqa: E402
from opinfo_known_failures import KNOWN_FAILURES  # noqa: E402
from opinfo_compare import compare, outside_int32  # noqa: E402
from opinfo_support import PASS, entry_id, op_db, run_entry  # noqa: E402

# The coverage goal: at least this share of the "ordinary models" entries must pass.
GOAL = 0.90


def _params() -> list:
    params = []
    for key in ORDINARY:
        marks = []
        if key in KNOWN_FAILURES:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[key]))
        params.append(pytest.param(key, id=entry_id(key), marks=marks))
    return params


@pytest.mark.parametrize("key", _params())
def test_opinfo_entry(key: tuple[str, str]) -> None:
    """Every float32 sample (up to the cap) converts, runs and matches torch."""
    result = run_entry(key)
    failures = result.failures()
    assert not failures, f"{entry_id(key)}: {len(failures)} failing sample(s)\n" + "\n".join(failures)
    # An entry where no sample could run (torch cannot export any, or none is comparable)
    # would count as covered without having run; the side table must list it with the reason.
    if result.status != PASS:
        reasons = "\n".join(s.detail for s in result.samples)
        pytest.fail(f"{entry_id(key)}: no sample could be checked ({result.status}):\n{reasons}")


def test_known_failures_table_is_valid_and_within_goal() -> None:
    """The side table names real entries with reasons, and leaves at least GOAL of the list passing."""
    db = op_db()
    for key, reason in KNOWN_FAILURES.items():
        assert key in db, f"{key} is not an OpInfo entry"
        assert key in ORDINARY, f"{key} is not run by this test; remove it from the side table"
        assert reason.strip(), f"{key} needs a reason"
    for key in ORDINARY:
        assert key in db, f"{key} in the ordinary list is not an OpInfo entry"
        assert db[key].supports_dtype(torch.float32, "cpu"), f"{key} has no float32 samples"
    # Every listed entry not in the side table must pass (its own test fails otherwise), so
    # the side table bounds the failure rate of a green run.
    share = 1 - len(KNOWN_FAILURES) / len(ORDINARY)
    assert share >= GOAL, f"only {share:.1%} of the ordinary entries are expected to pass (goal {GOAL:.0%})"


def test_compare_catches_differences() -> None:
    """The comparison used above rejects wrong values, dtypes, shapes and structures."""
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    good = x.numpy()
    assert compare(x, good) is None
    assert compare(x, good + 1e-3) is not None  # beyond rtol 1e-4 / atol 1e-5
    assert compare(x, good.astype(np.float16)) is not None
    assert compare(x, good.reshape(3, 2)) is not None
    assert compare((x, x), (good,)) is not None
    idx = torch.tensor([1, 2], dtype=torch.int64)  # int64 results are held as int32
    assert compare(idx, np.array([1, 2], np.int32)) is None
    assert compare(idx, np.array([1, 3], np.int32)) is not None
    assert compare(idx, np.array([1, 2], np.int64)) is None  # a 64-bit program keeps int64
    assert compare(idx, np.array([1, 2], np.int16)) is not None
    big = torch.tensor([2**33 + 1])  # wrapped to int32 it would read 1: that must not match
    assert compare(big, np.array([2**33 + 1], np.int64).astype(np.int32)) is not None
    assert outside_int32([big]) and outside_int32([2**40]) and not outside_int32([idx, 7, True])
