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

# One persistent XLA compilation cache per test run, shared by the xdist workers (they inherit
# the controller's environment) and the tests' subprocesses: a program another worker or an
# earlier test compiled already (the same example converted in two files) is read back rather
# than compiled again. Created empty at the start of each run and removed at its end, so no test
# depends on an earlier run. DYCL_TEST_XLA_CACHE=0 turns it off.
_XLA_CACHE_OWNER = False
if os.environ.get("DYCL_TEST_XLA_CACHE", "1") != "0" and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="dycl-test-xla-cache-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")  # tests' programs compile in ~0.1 s
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    _XLA_CACHE_OWNER = True  # the process that made it (the xdist controller) removes it

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


# The order tests start in. CI runs `-n 2 --dist worksteal`: each worker takes half of the
# collection and the first to run out takes half of what the other has not started. The longest
# tests go first, so the run never ends with one worker inside a minutes-long test while the other
# idles; the files of many ~1 s tests go last, where they even out the two workers' ends. Files
# not named keep their collection order, between the two. (Test CPU seconds, 2 cores, noisy.)
LONGEST_FIRST = (
    "test_dispatch_e2e.py::test_auto_dispatches_and_matches_torch[captioning_teacher]",  # 150-215 s
    "test_dynn_e2e.py",  # 11 examples x ~20 s (50 inputs, rewritten-torch trace, gradient parity)
    "test_dispatch_e2e.py",
    "test_staged_decode.py",
    "test_emit.py",
    "test_artifact.py::test_dispatch_round_trip_matches_torch_and_jm_trace[moe]",  # its artifact group: ~45 s
    "test_artifact.py::test_dispatch_round_trip_matches_torch_and_jm_trace[captioning]",  # ~35 s
    "test_artifact.py",
    "test_opinfo.py::test_opinfo_entry[tensor_split]",  # ~100 s: never the last test to start
    "test_emit_dispatch.py",
    "test_models_e2e.py",
    "test_train_mode.py",
    "test_threads.py",
    "test_vmap_batching.py",
)
SHORTEST_LAST = ("test_rewrite_converters.py", "test_opinfo.py")  # hundreds of tests of ~0.1-1.5 s


def _start_rank(item: pytest.Item) -> int:
    nodeid = item.nodeid.removeprefix("tests/")
    for rank, prefix in enumerate(LONGEST_FIRST):
        if nodeid == prefix or nodeid.startswith(prefix + "::"):
            return rank
    if item.path.name in SHORTEST_LAST:
        return len(LONGEST_FIRST) + 1 + SHORTEST_LAST.index(item.path.name)
    return len(LONGEST_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # a stable sort: within a file tests keep their order, so module fixtures are set up once
    items.sort(key=_start_rank)


# Opt-in CPU accounting: DYCL_TEST_CPU_LOG=path appends one "nodeid<TAB>cpu_s" line per test
# (setup + call + teardown, this process plus finished subprocesses). CPU, not wall, because
# the two workers share two cores with whatever else runs there.
_CPU_LOG = os.environ.get("DYCL_TEST_CPU_LOG")


def _cpu_now() -> float:
    import resource
    import time

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


if _CPU_LOG:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
        start = _cpu_now()
        yield
        with open(_CPU_LOG, "a") as log:
            log.write(f"{item.nodeid}\t{_cpu_now() - start:.2f}\n")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _XLA_CACHE_OWNER:
        import shutil

        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
