"""Differential test: PyTorch OpInfo samples in every supported dtype (float32, float16, bfloat16,
int32, int64, bool) through to_jax with dynamic batch on, compared with eager torch.

CI runs the first 4 float32 samples of every entry and, of every other dtype it supports, the
first and the middle sample (`ci_samples`), plus the samples that once found a lowering bug
(REGRESSION_SAMPLES; only those for the REGRESSION_ONLY entries); every sample runs with
`pytest -m opinfo_full tests/test_opinfo.py`.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # the helpers live next to this file, not in the package

from opinfo_entries import ORDINARY, REGRESSION_ONLY, REGRESSION_SAMPLES  # noqa: E402
from opinfo_known_failures import KNOWN_FAILURES, listed  # noqa: E402
from opinfo_compare import align_signs, compare, compare_tie_free, no_less_accurate, outside_int32  # noqa: E402
from opinfo_selection import selection  # noqa: E402
from opinfo_support import PASS, Choose, dtype_name, dtypes_of, entry_id, op_db, run_entry  # noqa: E402

# The coverage goal: at least this share of the "ordinary models" entries, and of their
# (entry, dtype) pairs, must pass.
GOAL = 0.90
CI_FLOAT32 = 4  # float32 samples per entry in CI; the opinfo_full tier runs every sample


def ci_samples(key: tuple[str, str]) -> Choose:
    """What CI runs of an entry: as many samples as fit in its time (the whole test adds about
    as much as the float32-only one took), every dtype, and every sample that found a bug."""
    def choose(dtype: str, count: int) -> set[int]:
        if key in REGRESSION_ONLY:
            picked: set[int] = set()
        else:
            picked = set(range(CI_FLOAT32)) if dtype == "float32" else {0, count // 2}
        return picked | set(REGRESSION_SAMPLES.get((*key, dtype), ()))
    return choose


def _params(full: bool) -> list:
    params = []
    for key in ORDINARY:
        marks = [pytest.mark.opinfo_full] if full else []
        if key in KNOWN_FAILURES:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[key]))
        params.append(pytest.param(key, id=entry_id(key), marks=marks))
    return params


def _check(key: tuple[str, str], choose: Choose | None, dtypes: list[torch.dtype] | None = None) -> None:
    result = run_entry(key, dtypes, choose=choose)
    problems = []
    for dtype in result.dtypes:
        reason = KNOWN_FAILURES.get((*key, dtype))  # a listed limit of this dtype only
        if reason is None:
            problems += result.failures(dtype)
        elif not result.failures(dtype):  # its REGRESSION_SAMPLES show the limit in every tier
            problems.append(f"{dtype} passes now: remove {(*key, dtype)} from the side table ({reason})")
    assert not problems, f"{entry_id(key)}: {len(problems)} problem(s)\n" + "\n".join(problems)
    # An entry where no sample could run (torch cannot export any, or none is comparable)
    # would count as covered without having run; the side table must list it with the reason.
    if result.status != PASS:
        reasons = "\n".join(f"{s.dtype}: {s.detail}" for s in result.samples)
        pytest.fail(f"{entry_id(key)}: no sample could be checked ({result.status}):\n{reasons}")


@pytest.mark.parametrize("key", _params(full=False))
def test_opinfo_entry(key: tuple[str, str]) -> None:
    """The CI samples (ci_samples) of every supported dtype convert, run and match torch. An
    entry the side table lists whole runs in float32 only: it fails in every dtype for the
    reason given there, and each of its failing samples costs a dispatch conversion."""
    _check(key, ci_samples(key), [torch.float32] if key in KNOWN_FAILURES else None)


@pytest.mark.parametrize("key", _params(full=True))
def test_opinfo_entry_all_samples(key: tuple[str, str]) -> None:
    """Every sample of every supported dtype (the opinfo_full tier, not run by CI)."""
    _check(key, None)


def test_known_failures_table_is_valid_and_within_goal() -> None:
    """The side table names real entries and dtypes with reasons, and leaves at least GOAL of the
    entries and of the (entry, dtype) pairs passing."""
    db = op_db()
    wide = set(selection(db))
    dtypes = {key: [dtype_name(d) for d in dtypes_of(key)] for key in ORDINARY}
    for key, reason in KNOWN_FAILURES.items():
        entry = key[:2]
        assert entry in db, f"{entry} is not an OpInfo entry"
        # the wide selection's failures are listed too (scripts/op_coverage.py --selection reads them)
        assert entry in ORDINARY or entry in wide, f"{entry} is in neither list; remove it from the side table"
        assert len(key) == 2 or key[2] in [dtype_name(d) for d in dtypes_of(entry)], f"{key}: no {key[2]} samples"
        assert reason.strip(), f"{key} needs a reason"
    for key in ORDINARY:
        assert key in db, f"{key} in the ordinary list is not an OpInfo entry"
        assert db[key].supports_dtype(torch.float32, "cpu"), f"{key} has no float32 samples"
    for (name, variant, dtype), indices in REGRESSION_SAMPLES.items():
        assert (name, variant) in ORDINARY and dtype in dtypes[(name, variant)], (name, variant, dtype)
        assert indices, (name, variant, dtype)
    for key in REGRESSION_ONLY:  # CI runs nothing else of it: every dtype needs a sample
        assert all((*key, d) in REGRESSION_SAMPLES for d in dtypes[key]), f"{key}: a sample per dtype"
    for key in KNOWN_FAILURES:  # a limit of one dtype must show in CI, which runs only some samples
        ordinary = key[:2] in ORDINARY
        assert len(key) == 2 or not ordinary or key in REGRESSION_SAMPLES, f"{key}: list a failing sample in " \
            "REGRESSION_SAMPLES"
    # Every listed entry not in the side table must pass (its own test fails otherwise), so
    # the side table bounds the failure rate of a green run.
    failing = {key[:2] for key in KNOWN_FAILURES if key[:2] in ORDINARY}
    share = 1 - len(failing) / len(ORDINARY)
    assert share >= GOAL, f"only {share:.1%} of the ordinary entries are expected to pass (goal {GOAL:.0%})"
    pairs = [(key, d) for key in ORDINARY for d in dtypes[key]]
    pair_share = 1 - sum(listed(key, d) is not None for key, d in pairs) / len(pairs)
    assert pair_share >= GOAL, f"only {pair_share:.1%} of the (entry, dtype) pairs are expected to pass"


def test_compare_catches_differences() -> None:
    """The comparison used above rejects wrong values, dtypes, shapes and structures."""
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    good = x.numpy()
    assert compare(x, good) is None
    assert compare(x, good + 1e-3) is not None  # beyond rtol 1e-4 / atol 1e-5
    assert compare(x, good.astype(np.float16)) is not None
    assert compare(x, good.reshape(3, 2)) is not None
    assert compare((x, x), (good,)) is not None
    assert compare(torch.Size([2, 3]), (2, 3)) is None  # torch.Size comes back as its tuple
    assert compare(torch.Size([2, 3]), (2, 4)) is not None
    half = torch.tensor([1000.0, 1.0], dtype=torch.float16)  # ulp 0.5 at 1000: 4 eps is 3.9
    assert compare(half, np.array([1003.5, 1.0], np.float16)) is None  # 7 ulps
    assert compare(half, np.array([1004.5, 1.0], np.float16)) is not None  # 9 ulps
    assert compare(half, np.array([1000.0, 1.0], np.float32)) is not None  # dtype
    bf = torch.tensor([3.0, -2.0], dtype=torch.bfloat16)
    import jax.numpy as jnp
    assert compare(bf, np.asarray(jnp.asarray([3.0, -2.0], jnp.bfloat16))) is None
    assert compare(bf, np.asarray(jnp.asarray([3.5, -2.0], jnp.bfloat16))) is not None
    idx = torch.tensor([1, 2], dtype=torch.int64)  # int64 results are held as int32
    assert compare(idx, np.array([1, 2], np.int32)) is None
    assert compare(idx, np.array([1, 3], np.int32)) is not None
    assert compare(idx, np.array([1, 2], np.int64)) is None  # a 64-bit program keeps int64
    assert compare(idx, np.array([1, 2], np.int16)) is not None
    assert compare(torch.tensor([True]), np.array([1], np.int32)) is not None
    torch_half, exact = torch.tensor([0.53], dtype=torch.float16), torch.tensor([0.54])
    assert no_less_accurate(torch_half, exact, np.array([0.54], np.float16)) is None  # closer than torch
    assert no_less_accurate(torch_half, exact, np.array([0.58], np.float16)) is not None
    ints = (torch.tensor([1, 2]), torch.tensor([0.5]))  # an integer leaf is never judged by accuracy
    assert no_less_accurate(ints, ints, (np.array([1, 3], np.int32), np.array([0.5], np.float32))) is not None
    w, v = torch.tensor([1.0, 2.0]), torch.tensor([[0.6, 0.8], [0.8, -0.6]])  # eigenvectors up to sign
    flipped = align_signs("linalg.eigh", (w, v), (w.numpy(), v.numpy() * np.array([-1.0, 1.0], np.float32)))
    assert compare((w, v), flipped) is None
    other = align_signs("linalg.eigh", (w, v), (w.numpy(), np.array([[0.8, 0.6], [0.6, -0.8]], np.float32)))
    assert compare((w, v), other) is not None  # other vectors stay other vectors
    ties = torch.tensor([1.0, 1.0, 0.0])
    want = torch.sort(ties)  # values [0, 1, 1]: the order of the two 1s is torch's choice
    values = want.values.numpy()
    ok = compare_tie_free("sort", ties, (), {}, tuple(want), (values, np.array([2, 1, 0], np.int32)))
    assert ok is None
    for bad in ([0, 1, 2], [2, 0, 0]):  # selects other values; not a permutation
        assert compare_tie_free("sort", ties, (), {}, tuple(want), (values, np.array(bad, np.int32))) is not None
    big = torch.tensor([2**33 + 1])  # wrapped to int32 it would read 1: that must not match
    assert compare(big, np.array([2**33 + 1], np.int64).astype(np.int32)) is not None
    assert outside_int32([big]) and outside_int32([2**40]) and not outside_int32([idx, 7, True])
