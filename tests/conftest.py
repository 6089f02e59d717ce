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
