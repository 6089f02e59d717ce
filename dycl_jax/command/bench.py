"""`dycl-jax bench`: torch eager vs the converted model, paired medians on one thread each."""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def pin_threads() -> None:
    """One core, one torch thread, single-threaded XLA kernels, JAX dispatch inline as torch's.

    Must run before JAX starts its CPU client (the first computation) and before torch starts
    its thread pool: `dycl-jax bench` calls it first thing."""
    import jax
    import torch

    if hasattr(os, "sched_setaffinity"):  # threads inherit the affinity of the thread that creates them
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_XLA_FLAGS}".strip()
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    torch.set_num_threads(1)


def interleaved(fns: list[Callable], cases: list[list], runs: int, warmup: int) -> list[float]:
    """Median seconds of each `fns[j](*cases[j][k])` over `runs` rounds, after `warmup` rounds.

    A round calls every function once on the same input k (cycling over the inputs), in an
    order from a balanced Latin square: over len(fns) rounds (2 * len(fns) for an odd number)
    every function runs in every position, and right after each other function exactly once,
    so none always inherits the caches one particular function left (for two: they alternate
    going first). (All permutations would do that only after len(fns)! rounds; their first few
    all start the same way.)
    """
    times: list[list[float]] = [[] for _ in fns]
    orders = balanced_orders(len(fns))
    for i in range(warmup + runs):
        k = i % len(cases[0])
        for j in orders[i % len(orders)]:
            start = time.perf_counter()
            fns[j](*cases[j][k])
            elapsed = time.perf_counter() - start
            if i >= warmup:
                times[j].append(elapsed)
    return [statistics.median(t) for t in times]


def balanced_orders(n: int) -> list[list[int]]:
    """Williams' design: rows of 0..n-1 in which each ordered pair of neighbours occurs equally often."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:  # 0, 1, n-1, 2, n-2, ...
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(x + i) % n for x in first] for i in range(n)]
    return rows if n % 2 == 0 else rows + [row[::-1] for row in rows]


def _as_jax(args: tuple) -> tuple:
    """Tensor leaves as JAX arrays, so the timed calls do not convert them."""
    import jax.numpy as jnp
    import torch
    import torch.utils._pytree as pytree

    def one(t: torch.Tensor) -> Any:
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16
            return jnp.asarray(t.float().numpy()).astype(jnp.bfloat16)
        return jnp.asarray(t.detach().numpy())

    return pytree.tree_map_only(torch.Tensor, one, args)


def bench(ns: argparse.Namespace, out: Console, err: Console) -> int:
    """Convert, warm both sides up, time them in alternation; print one table row."""
    import jax
    import torch

    from dycl_jax import to_jax
    from dycl_jax.command.convert import prepare
    from dycl_jax.command.exits import OK
    from dycl_jax.command.progress import stages
    from dycl_jax.report.parity import compare

    prep = prepare(ns)
    model = prep.target.model
    with stages(err) as step:
        start = time.perf_counter()
        jm = to_jax(model, prep.args, method=ns.method, host=ns.host, max_len=ns.max_len, progress=step)
        convert_s = time.perf_counter() - start
        model.eval()
        cases = [prep.args] + prep.checks
        jax_cases = [_as_jax(c) for c in cases]
        step("first call: trace + XLA compile")
        start = time.perf_counter()
        jax.block_until_ready(jm(*jax_cases[0]))
        compile_s = time.perf_counter() - start
        step(f"timing: {ns.warmup} warm-up + {ns.runs} paired rounds over {len(cases)} inputs")
        method = getattr(model, ns.method)

        def eager(*a: Any) -> Any:
            with torch.inference_mode():
                return method(*a)

        t, j = interleaved([eager, lambda *a: jax.block_until_ready(jm(*a))], [cases, jax_cases], ns.runs, ns.warmup)
        diff = max(compare(eager(*c), jm(*jc))["diff"] for c, jc in zip(cases, jax_cases))
    table = Table(title=f"torch eager vs dycl_jax ({ns.runs} paired rounds after {ns.warmup} warm-up, one thread each)",
                  title_justify="left")
    for col in ("model", "host", "torch ms", "JAX ms", "torch/JAX", "convert s", "compile s", "max |diff|"):
        table.add_column(col, justify="left" if col in ("model", "host") else "right", no_wrap=col != "model")
    table.add_row(type(model).__name__, jm.host, f"{t * 1e3:.3f}", f"{j * 1e3:.3f}", f"{t / j:.2f}",
                  f"{convert_s:.2f}", f"{compile_s:.2f}", f"{diff:.2g}")
    out.print(table)
    return OK


def add_bench_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=50, metavar="N", help="timed rounds (default 50)")
    p.add_argument("--warmup", type=int, default=5, metavar="N", help="untimed rounds first (default 5)")
