"""Torch eager vs the converted model on one accelerator (or the CPU): latency at batch 1 and throughput at batch N.

    python scripts/device_bench.py [--device auto|gpu|cpu] [--batches 1,32] [--only NAME] [--runs N] [--budget S]

For every DyNN example (examples/dynn): conversion time, first call (XLA compile), then paired
medians of torch eager and the converted model, called back to back in one process. Batch 1
is the example's own call. Batch N is N single samples with per-sample decisions, the only
meaning batch-1 research code has: torch runs them one after another; a staged model runs
them as one `jax.vmap(jm.apply)` program (a per-sample `lax.cond` is a select there: both
branches run), a dispatch-host model one after another as torch does. A speed is printed only
where the outputs match torch's (floats within FLOAT_TOL, integers exactly).

For staged models at batch N, `loop ms` is the converted model called once per sample: it
runs only each sample's taken branch, so `jax ms` against it is what the vmap's selects cost
(or save, where one program beats N calls).

On a CPU, pin XLA to one thread as torch is (`XLA_FLAGS="--xla_cpu_multi_thread_eigen=false
intra_op_parallelism_threads=1"`): the torch side runs with one thread.

Precision is pinned so that both sides compute float32 matmuls and convolutions in float32:
no TF32 in torch (cuda.matmul / cudnn) and `jax_default_matmul_precision="highest"`.
`--budget` stops starting new models after that many seconds (the table shows what ran).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
import torch
from flax import nnx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dycl_jax import to_jax  # noqa: E402
from dycl_jax.report.parity import compare  # noqa: E402
from examples.dynn import BOUNDED_MODELS, DISPATCH_MODELS, MODELS, load  # noqa: E402

FLOAT_TOL = 1e-3
warnings.simplefilter("ignore")


@dataclass
class Result:
    model: str
    host: str = ""
    batch: int = 1
    convert_s: float | None = None
    compile_s: float | None = None
    torch_ms: float | None = None
    jax_ms: float | None = None
    loop_ms: float | None = None  # staged batch N: jm called once per sample, for the vmap's select cost
    error: str = ""


def pin_precision() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    jax.config.update("jax_default_matmul_precision", "highest")


def medians(fns: list[Callable[[], Any]], runs: int, warmup: int = 3) -> list[float]:
    """Median seconds of each fn over `runs` rounds, alternating which goes first."""
    times: list[list[float]] = [[] for _ in fns]
    for i in range(warmup + runs):
        order = range(len(fns)) if i % 2 == 0 else reversed(range(len(fns)))
        for j in order:
            start = time.perf_counter()
            fns[j]()
            if i >= warmup:
                times[j].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def _to(args: tuple, device: torch.device) -> tuple:
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args)


def _jax_args(args: tuple) -> tuple:
    return tuple(jax.device_put(a.numpy()) if isinstance(a, torch.Tensor) else a for a in args)


def _wrong(refs: list[Any], outs: list[Any]) -> str:
    for k, (ref, out) in enumerate(zip(refs, outs)):
        c = compare(jax.tree.map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, ref), out)
        if c["problems"] or c["match"] != c["total"] or c["diff"] > FLOAT_TOL:
            return f"input {k}: outputs differ from torch (max |diff| {c['diff']:.2g}, {c['problems'][:1]})"
    return ""


def bench_model(name: str, batches: list[int], device: torch.device, runs: int) -> list[Result]:
    mod = load(name)
    model, args = mod.example()
    start = time.perf_counter()
    try:
        jm = to_jax(model, args)
    except Exception as exc:  # one model failing must not hide the others
        return [Result(name, error=f"conversion: {type(exc).__name__}: {exc}".splitlines()[0])]
    convert_s = time.perf_counter() - start
    tmodel = model.to(device)
    results = []
    for batch in batches:
        r = Result(name, jm.host, batch, convert_s)
        cases = mod.inputs(batch)
        t_cases = [_to(c, device) for c in cases]
        j_cases = [_jax_args(c) for c in cases]
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        if batch == 1:
            run_jax = lambda: jax.block_until_ready(jm(*j_cases[0]))  # noqa: E731
            jax_outs: Callable[[], list[Any]] = lambda: [jm(*j_cases[0])]  # noqa: E731
        elif jm.host == "staged" and all(isinstance(a, torch.Tensor) for a in cases[0]):
            stacked = [jax.device_put(np.stack([c[i].numpy() for c in cases])) for i in range(len(cases[0]))]
            state = nnx.state(jm.module)
            vm = jax.jit(jax.vmap(jm.apply, in_axes=(None,) + (0,) * len(stacked)))
            run_jax = lambda: jax.block_until_ready(vm(state, *stacked))  # noqa: E731
            jax_outs = lambda: [jax.tree.map(lambda leaf, k=k: leaf[k], vm(state, *stacked))  # noqa: E731
                                for k in range(batch)]
        else:  # dispatch host: Python control flow, one sample after another
            run_jax = lambda: [jax.block_until_ready(jm(*c)) for c in j_cases]  # noqa: E731
            jax_outs = lambda: [jm(*c) for c in j_cases]  # noqa: E731

        def run_torch() -> None:
            with torch.inference_mode():
                for c in t_cases[:batch]:
                    tmodel(*c)
            sync()

        start = time.perf_counter()
        run_jax()
        r.compile_s = time.perf_counter() - start
        with torch.inference_mode():
            refs = [tmodel(*c) for c in t_cases]
        r.error = _wrong(refs, jax_outs())
        if not r.error:
            t, j = medians([run_torch, run_jax], runs)
            r.torch_ms, r.jax_ms = t * 1e3, j * 1e3
            if batch > 1 and jm.host == "staged":
                # under vmap every per-sample cond is a select that runs both branches; a loop of
                # single-sample calls runs only the taken one: the ratio is what the select costs
                run_loop = lambda: [jax.block_until_ready(jm(*c)) for c in j_cases]  # noqa: E731
                run_loop()
                r.loop_ms = medians([run_loop], max(3, runs // 4))[0] * 1e3
        results.append(r)
    return results


def render(results: list[Result], device: str, console: Console) -> None:
    table = Table(title=f"torch eager vs dycl_jax on {device} (float32, no TF32)", title_justify="left")
    for col in ("model", "host", "batch"):
        table.add_column(col, no_wrap=True)
    for col in ("convert s", "compile s", "torch ms", "jax ms", "torch/jax", "loop ms"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("note", overflow="fold")
    ratios: dict[int, list[float]] = {}
    for r in results:
        ratio = r.torch_ms / r.jax_ms if r.torch_ms and r.jax_ms else None
        if ratio:
            ratios.setdefault(r.batch, []).append(ratio)
        f = lambda v, s: "" if v is None else format(v, s)  # noqa: E731
        table.add_row(r.model, r.host, str(r.batch), f(r.convert_s, ".1f"), f(r.compile_s, ".2f"),
                      f(r.torch_ms, ".3f"), f(r.jax_ms, ".3f"), f(ratio, ".2f"), f(r.loop_ms, ".3f"), r.error)
    console.print(table)
    for batch, rs in sorted(ratios.items()):
        gm = float(np.exp(np.mean(np.log(rs))))
        console.print(f"batch {batch}: geometric mean torch/jax {gm:.2f} over {len(rs)} models (> 1: JAX faster)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("auto", "gpu", "cpu"), default="auto")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--only", action="append", help="model name (repeatable)")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--budget", type=float, default=240.0, help="seconds after which no new model starts")
    ns = p.parse_args(argv)
    gpu = ns.device == "gpu" or (ns.device == "auto" and torch.cuda.is_available())
    if gpu and not (torch.cuda.is_available() and jax.default_backend() == "gpu"):
        print(f"--device gpu: torch.cuda available={torch.cuda.is_available()}, jax backend={jax.default_backend()};"
              " install a CUDA torch and jax[cuda12] (README, GPU)", file=sys.stderr)
        return 3
    if not gpu:
        torch.set_num_threads(1)
    pin_precision()
    device = torch.device("cuda" if gpu else "cpu")
    names = ns.only or list(MODELS) + list(BOUNDED_MODELS) + list(DISPATCH_MODELS)
    batches = [int(b) for b in ns.batches.split(",")]
    console = Console(width=max(Console().width, 132))  # a table of numbers: never fold its cells
    console.print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; torch {torch.__version__} on {device}")
    results: list[Result] = []
    start = time.perf_counter()
    for name in names:
        if time.perf_counter() - start > ns.budget:
            results.append(Result(name, error=f"not run: the {ns.budget:.0f} s budget was spent"))
            continue
        console.print(f"[dim]{name}...[/dim]")
        results.extend(bench_model(name, batches, device, ns.runs))
    render(results, "GPU" if gpu else f"CPU ({os.cpu_count()} cores)", console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
