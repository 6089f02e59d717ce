"""OpInfo entries expected to fail, each with the reason; tests/test_opinfo.py xfails them strictly."""
from __future__ import annotations

# (OpInfo name, variant_test_name) -> why the entry cannot pass now. Listing an entry makes its
# test xfail(strict=True): once it passes, the run fails until the line here is removed.
# Only limits that are not bugs belong here; a lowering bug is fixed, not listed.
KNOWN_FAILURES: dict[tuple[str, str], str] = {
    ("tensor_split", ""): (
        "the samples pass the split points as an int64 tensor, so the output shapes depend on tensor "
        "values; one XLA program needs static shapes and dycl_jax raises a DyclError naming the dispatch host"
    ),
    ("repeat_interleave", ""): (
        "a sample passes `repeats` as a tensor: the output length depends on tensor values, which one XLA "
        "program cannot hold; dycl_jax raises a DyclError naming the dispatch host"
    ),
    ("nn.functional.instance_norm", ""): (
        "every sample passes running_mean/running_var with use_input_stats=True, so the op updates "
        "its inputs in place; converted models are pure functions and capture refuses input mutation"
    ),
}
