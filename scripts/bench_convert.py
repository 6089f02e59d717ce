"""Conversion time per stage and peak host memory of `to_jax`, each run in a fresh process.

    python scripts/bench_convert.py [--file PATH[:FUNCTION]] [--runs N] [--no-memory] [--json OUT]

The default model is BlockDrop on ResNet-110 (`examples/dynn/blockdrop110.py`, 54 gated
blocks). Every timing run is a new Python process (nothing cached from an earlier
conversion: rewrite cache, torch's and JAX's compile caches): it converts the model, calls it
once (trace + XLA compile + run) and prints the report's stage timings, wall and CPU seconds
of the process (the steadier figure where the machine is shared); the table shows the median
of the runs and their spread (min-max), and the load average around them. The first import of
`dycl_jax.convert` is timed as a row of its own, outside the conversion (once per process).

The memory run is one more process, with `tracemalloc` on (which slows Python down, so its
times are not used): the resident set size (RSS) before the conversion, its peak during the
conversion (`ru_maxrss`), after it, after the first call, and after the torch model is
dropped; the peak of Python-heap allocations (tracemalloc: fx graphs, nodes, metadata;
not tensor storage, which torch allocates outside Python's heap), what of it is still live after
the conversion and once only the JaxModel is left; the size of the torch
parameters and of the JAX state; and how many of the torch model's parameters and buffers
are still alive once the user drops the model (a JaxModel that kept them would hold every
parameter twice).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "examples" / "dynn" / "blockdrop110.py"
STAGES = ("rewrite_s", "export_s", "decompose_s", "lower_s", "check_s", "first_call_s")
LABELS = {"import_s": "import dycl_jax.convert", "rewrite_s": "rewrite", "export_s": "torch.export", "decompose_s": "run_decompositions",
          "lower_s": "lowering", "check_s": "eval_shape check", "first_call_s": "first call (compile + run)",
          "convert_s": "to_jax total", "total_s": "conversion + first call",
          "import_total_s": "import + conversion + first call"}


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _cpu_s() -> float:
    import resource

    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime  # every thread of this process


def child(spec: str, memory: bool) -> dict[str, Any]:
    """One conversion in this (fresh) process; what it measured, as JSON-ready data."""
    import gc
    import tracemalloc
    import warnings
    import weakref

    warnings.simplefilter("ignore")
    sys.path.insert(0, str(ROOT))
    import jax
    import numpy as np
    import torch

    import dycl_jax
    from dycl_jax.command.targets import load_target

    target = load_target(spec)
    model, args = target.model, target.args
    out: dict[str, Any] = {"model": type(model).__name__}
    tensors = list(model.parameters()) + list(model.buffers())
    out["torch_state_mb"] = sum(t.numel() * t.element_size() for t in tensors) / 2**20
    alive = [weakref.ref(t) for t in tensors]
    del tensors
    gc.collect()
    if memory:
        out["rss_before_mb"] = _rss_mb()
        out["peak_rss_before_mb"] = _peak_rss_mb()
        tracemalloc.start()
    # the first import of the converter (flax, the lowering registry, ...) is timed on its own:
    # a user pays it once per process, not once per conversion
    start, cpu = time.perf_counter(), _cpu_s()
    to_jax = dycl_jax.to_jax
    out["import_s"] = time.perf_counter() - start
    out["cpu_import_s"] = _cpu_s() - cpu
    start, cpu = time.perf_counter(), _cpu_s()
    jm = to_jax(model, args)
    out["convert_s"] = time.perf_counter() - start
    out["cpu_convert_s"] = _cpu_s() - cpu
    if memory:
        live, peak = tracemalloc.get_traced_memory()
        out["tracemalloc_peak_convert_mb"] = peak / 2**20
        out["tracemalloc_live_after_convert_mb"] = live / 2**20
        tracemalloc.reset_peak()
        out["peak_rss_convert_mb"] = _peak_rss_mb()
        out["rss_after_convert_mb"] = _rss_mb()
    start, cpu = time.perf_counter(), _cpu_s()
    jax.block_until_ready(jm(*args))
    first = time.perf_counter() - start
    out["cpu_first_call_s"] = _cpu_s() - cpu
    report = jm.report()
    out["timings"] = {**report.timings, "first_call_s": first}
    out["host"] = jm.host
    if memory:
        out["tracemalloc_peak_first_call_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
        out["rss_after_first_call_mb"] = _rss_mb()
        state = jax.tree_util.tree_leaves(jm._state_values())
        out["jax_state_mb"] = sum(np.asarray(a).nbytes for a in state) / 2**20
        del model, args, target
        gc.collect()
        out["torch_state_alive"] = sum(r() is not None for r in alive)
        out["torch_state_total"] = len(alive)
        out["rss_after_drop_torch_mb"] = _rss_mb()
        # what the JaxModel alone keeps on the Python heap (graphs for emission, report, caches)
        out["tracemalloc_live_jm_only_mb"] = tracemalloc.get_traced_memory()[0] / 2**20
        tracemalloc.stop()
    return out


def _run_child(spec: str, memory: bool) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", "--file", spec] + (["--memory"] if memory else [])
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"benchmark process failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _stage_rows(runs: list[dict[str, Any]]) -> list[tuple[str, list[float], list[float]]]:
    """Per stage: its label, the wall seconds of every run, and the CPU seconds of every run."""
    rows = []
    for key in ("import_s",) + STAGES + ("convert_s", "total_s", "import_total_s"):
        wall, cpu = [], []
        for r in runs:
            t = r["timings"]
            if key == "import_s":
                wall.append(r["import_s"])
                cpu.append(r["cpu_import_s"])
            elif key == "import_total_s":
                wall.append(r["import_s"] + r["convert_s"] + t["first_call_s"])
                cpu.append(r["cpu_import_s"] + r["cpu_convert_s"] + r["cpu_first_call_s"])
            elif key == "convert_s":
                wall.append(r["convert_s"])
                cpu.append(r["cpu_convert_s"])
            elif key == "total_s":
                wall.append(r["convert_s"] + t["first_call_s"])
                cpu.append(r["cpu_convert_s"] + r["cpu_first_call_s"])
            elif key == "first_call_s":
                wall.append(t[key])
                cpu.append(r["cpu_first_call_s"])
            elif key in t:
                wall.append(t[key])
                if key[:-2] + "_cpu_s" in t:
                    cpu.append(t[key[:-2] + "_cpu_s"])
        if wall:
            rows.append((LABELS[key], wall, cpu))
    return rows


def _cell(values: list[float]) -> str:
    if not values:
        return f"{'':>22}"
    return f"{statistics.median(values):8.2f} ({min(values):5.2f}-{max(values):5.2f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", default=str(DEFAULT), help="example file (default: BlockDrop ResNet-110)")
    p.add_argument("--runs", type=int, default=3, help="timing runs, each in a fresh process")
    p.add_argument("--no-memory", action="store_true", help="skip the memory run")
    p.add_argument("--json", help="write the measurements here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--memory", action="store_true", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.child:
        print(json.dumps(child(ns.file, ns.memory)))
        return 0
    load = f"{os.getloadavg()[0]:.2f}"
    runs = [_run_child(ns.file, memory=False) for _ in range(ns.runs)]
    print(f"{runs[0]['model']} ({runs[0]['host']}), {len(runs)} fresh processes; seconds, median (min-max)")
    print(f"load average before: {load}; after: {os.getloadavg()[0]:.2f} (wall time is shared, CPU time is this process's)")
    print(f"{'stage':<30} {'wall':>22} {'CPU':>22}")
    for label, wall, cpu in _stage_rows(runs):
        print(f"{label:<30} {_cell(wall)} {_cell(cpu)}")
    result: dict[str, Any] = {"runs": runs}
    if not ns.no_memory:
        mem = result["memory"] = _run_child(ns.file, memory=True)
        print("\nmemory (one more process, tracemalloc on), MiB")
        for key in ("rss_before_mb", "peak_rss_convert_mb", "rss_after_convert_mb", "rss_after_first_call_mb",
                    "rss_after_drop_torch_mb", "tracemalloc_peak_convert_mb", "tracemalloc_live_after_convert_mb",
                    "tracemalloc_peak_first_call_mb", "tracemalloc_live_jm_only_mb",
                    "torch_state_mb", "jax_state_mb"):
            print(f"{key:<32} {mem[key]:10.1f}")
        if mem["peak_rss_before_mb"] >= mem["peak_rss_convert_mb"]:
            print("(the process peak came before the conversion: peak_rss_convert_mb is that earlier peak)")
        print(f"torch parameters/buffers alive after the model is dropped: "
              f"{mem['torch_state_alive']} of {mem['torch_state_total']}")
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
