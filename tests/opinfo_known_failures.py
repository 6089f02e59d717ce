"""OpInfo entries expected to fail, each with the reason; tests/test_opinfo.py xfails them strictly."""
from __future__ import annotations

# (OpInfo name, variant_test_name) -> why the entry cannot pass now. Listing an entry makes its
# test xfail(strict=True): once it passes, the run fails until the line here is removed.
# Only limits that are not bugs belong here; a lowering bug is fixed, not listed.
KNOWN_FAILURES: dict[tuple[str, str], str] = {
    ("nn.functional.instance_norm", ""): (
        "every sample passes running_mean/running_var with use_input_stats=True, so the op updates the "
        "caller's tensors in place; converted models are pure functions and raise InputMutationError"
    ),
}
