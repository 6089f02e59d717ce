"""OpInfo entries (or one dtype of an entry) expected to fail, each with the reason; tests/test_opinfo.py checks them strictly."""
from __future__ import annotations

# (OpInfo name, variant_test_name) -> why the entry cannot pass now: its test is
# xfail(strict=True), so once it passes the run fails until the line here is removed.
# (name, variant, dtype name) -> why that dtype of the entry cannot pass: its failures are
# allowed, and its test fails once that dtype passes (a failing sample must be listed in
# opinfo_entries.REGRESSION_SAMPLES, so CI runs it).
# Only limits that are not bugs belong here; a lowering bug is fixed, not listed (the wide
# selection's unfixed bugs below are listed so that none is hidden, each marked as a bug).
KNOWN_FAILURES: dict[tuple[str, ...], str] = {
    # wide selection only (scripts/op_coverage.py --selection; not run by tests/test_opinfo.py)
    ("chalf", ""): (
        "casts to complex32, which JAX has no dtype for: conversion refuses with an UnsupportedDtypeError "
        "(`JAX has no complex32 dtype`) instead of returning another dtype"
    ),
    ("matrix_exp", "", "float16"): (
        "torch's CPU kernel for half types reads its double-precision Taylor coefficients as float16 "
        "values (LinearAlgebra.cpp: from_blob of a double array with the half dtype), so its results "
        "are not the exponential (exp of a 3x3 matrix of 1e-4 gives zeros, of ordinary inputs inf "
        "or NaN); dycl_jax computes the exponential (in float32, then rounded)"
    ),
    ("matrix_exp", "", "bfloat16"): "as float16: torch's half-type kernel misreads its coefficients",
    # measured failures of the wide selection not fixed yet: bugs to fix, listed so none is hidden
    ("geqrf", ""): (
        "torch.export refuses it (UnsupportedOperatorException: aten.geqrf.default), so the dispatch host "
        "runs it in torch; the lowering exists but no sample reaches it"
    ),
    ("hash_tensor", ""): (
        "no lowering for aten.hash_tensor: the XOR of the float64/int64 bit patterns as a uint64, which "
        "needs 64-bit unsigned integers"
    ),
    ("view_as_complex", "", "float16"): "as `complex` in float16: its result is complex32, which JAX has no dtype for",
    ("complex", "", "float16"): (
        "torch.complex of float16 parts is complex32, which JAX has no dtype for; conversion refuses with "
        "an UnsupportedDtypeError at the line that makes it (tests/test_dtypes.py)"
    ),
}


def listed(key: tuple[str, str], dtype: str) -> str | None:
    """Why (entry, dtype) is expected to fail, if the side table says so for it or its whole entry."""
    return KNOWN_FAILURES.get((*key, dtype)) or KNOWN_FAILURES.get(key)
