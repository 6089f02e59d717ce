"""OpInfo entries (or one dtype of an entry) expected to fail, each with the reason; tests/test_opinfo.py checks them strictly."""
from __future__ import annotations

# (OpInfo name, variant_test_name) -> why the entry cannot pass now: its test is
# xfail(strict=True), so once it passes the run fails until the line here is removed.
# (name, variant, dtype name) -> why that dtype of the entry cannot pass: its failures are
# allowed, and its test fails once that dtype passes (a failing sample must be listed in
# opinfo_entries.REGRESSION_SAMPLES, so CI runs it).
# Only limits that are not bugs belong here; a lowering bug is fixed, not listed.
KNOWN_FAILURES: dict[tuple[str, ...], str] = {
    ("nn.functional.instance_norm", ""): (
        "every sample passes running_mean/running_var with use_input_stats=True, so the op updates the "
        "caller's tensors in place; converted models are pure functions and raise InputMutationError"
    ),
    # wide selection only (scripts/op_coverage.py --selection; not run by tests/test_opinfo.py)
    ("chalf", ""): (
        "casts to complex32, which JAX has no dtype for: conversion refuses with a DyclError "
        "(`torch dtype torch.complex32 has no JAX equivalent`) instead of returning another dtype"
    ),
    ("complex", "", "float16"): (
        "torch.complex of float16 parts is complex32, which JAX has no dtype for; conversion refuses "
        "(the dispatch host's message, `HostValueError: a zip object`, does not yet say why)"
    ),
}


def listed(key: tuple[str, str], dtype: str) -> str | None:
    """Why (entry, dtype) is expected to fail, if the side table says so for it or its whole entry."""
    return KNOWN_FAILURES.get((*key, dtype)) or KNOWN_FAILURES.get(key)
