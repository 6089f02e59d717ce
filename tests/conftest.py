"""Shared test setup: importable example models, and cheaper XLA compiles for the CPU tests."""
from __future__ import annotations

import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the examples live next to the package, not inside it

# Tests spend most of their time compiling small programs, which they then run once. LLVM's
# optimisation level changes compile time (about -40% at 0), not results; XLA's own graph
# optimisations still run. Read when JAX starts its backend, so only if the user set nothing.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

import pytest  # noqa: E402  (after XLA_FLAGS: nothing here may start JAX's backend first)
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """One torch thread per test: two xdist workers share two cores, and torch's default
    threads would oversubscribe them (and slow every comparison 10x)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
