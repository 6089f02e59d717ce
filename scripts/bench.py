"""Latency of torch eager vs the converted JAX model for every example, on one CPU core.

    python scripts/bench.py [--dynn] [--only NAME] [--runs N] [--warmup K] [--json OUT]

Static examples (examples/*.py) run at batch 1 and 32; with --dynn the dynamic-network
examples (examples/dynn/*.py) run at batch 1, cycling over their `inputs(n)`. Each timed
iteration calls torch and JAX back to back (the order alternates), so both see the same
machine state; the table shows medians and their ratio torch/JAX (> 1: JAX is faster).

Fairness: torch uses one thread and XLA single-threaded kernels, and the whole process is
pinned to one core (`--no-pin` lifts that): XLA may run independent kernels of a program
on a second thread, which must not borrow a second core. JAX runs programs inline on the
calling thread, as torch eager does (`--async-dispatch` keeps JAX's default hand-off to a
worker thread, which adds a thread wake-up, ~30 µs on a busy machine, to every call).
"""
from __future__ import annotations

import os
import sys

# All of this must happen before torch and jax start their threads and XLA reads its flags.
PIN = "--no-pin" not in sys.argv[1:]
if PIN:  # threads inherit the affinity of the thread that creates them
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_XLA_FLAGS}".strip()
ASYNC_DISPATCH = "--async-dispatch" in sys.argv[1:]

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

import jax  # noqa: E402
import torch  # noqa: E402

jax.config.update("jax_cpu_enable_async_dispatch", ASYNC_DISPATCH)  # read when the CPU client starts
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from rich.text import Text  # noqa: E402

torch.set_num_threads(1)
# torch's and flax's prototype/deprecation notices would interleave with the table
warnings.simplefilter("ignore")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the examples import their package (examples.dynn) from the root

from _bench_models import Entry, discover, leading_dim, repeat_batch, to_jax_args  # noqa: E402

from dycl_jax import to_jax  # noqa: E402
from dycl_jax.cli import call_example, compare, extra_cases, load_entry  # noqa: E402

STATIC_BATCHES = (1, 32)


@dataclass
class Row:
    model: str
    kind: str
    batch: int | None = None
    convert_s: float | None = None
    compile_s: float | None = None
    torch_ms: float | None = None
    jax_ms: float | None = None
    ratio: float | None = None  # torch / jax
    max_abs_diff: float | None = None  # float outputs, first case
    note: str = ""
    error: str = ""


def paired(
    torch_fn: Callable, jax_fn: Callable, cases: list, jax_cases: list, runs: int, warmup: int
) -> tuple[float, float]:
    """Median seconds of torch and JAX over `runs` alternating calls, after `warmup` of each."""
    t_times, j_times = [], []
    for i in range(warmup + runs):
        k = i % len(cases)
        for side in ((0, 1) if i % 2 == 0 else (1, 0)):
            start = time.perf_counter()
            if side == 0:
                torch_fn(*cases[k])
            else:
                jax.block_until_ready(jax_fn(*jax_cases[k]))
            elapsed = time.perf_counter() - start
            if i >= warmup:
                (t_times if side == 0 else j_times).append(elapsed)
    return statistics.median(t_times), statistics.median(j_times)


def _first_call(jm: Any, jax_args: tuple) -> float:
    start = time.perf_counter()
    jax.block_until_ready(jm(*jax_args))
    return time.perf_counter() - start


def _timed_row(row: Row, model: Any, jm: Any, cases: list, ns: argparse.Namespace, warmup: int) -> Row:
    jax_cases = [to_jax_args(c) for c in cases]
    row.compile_s = _first_call(jm, jax_cases[0])
    with torch.inference_mode():
        row.max_abs_diff = compare(model(*cases[0]), jm(*jax_cases[0]))["diff"]
        t, j = paired(model, jm, cases, jax_cases, ns.runs, warmup)
    row.torch_ms, row.jax_ms, row.ratio = t * 1e3, j * 1e3, t / j
    return row


def _static_args(module: Any, args: tuple, batch: int, dynamic: list[bool] | None) -> tuple:
    # the file's own `inputs(batch)` (one argument tuple) when it has one, else repeated rows
    made = extra_cases(module, batch)
    if len(made) == 1 and leading_dim(made[0]) == batch:
        return made[0]
    return repeat_batch(args, batch, dynamic)


def bench_static(entry: Entry, model: Any, args: tuple, module: Any, ns: argparse.Namespace) -> list[Row]:
    start = time.perf_counter()
    jm = to_jax(model, args)
    convert_s = time.perf_counter() - start
    dynamic = [bool(s.shape) and s.shape[0] is None for s in jm.signature.inputs]
    rows = []
    for batch in STATIC_BATCHES:
        row = Row(entry.name, entry.kind, batch, convert_s)
        try:
            if any(dynamic) or leading_dim(args) == batch:
                bjm, bargs = jm, _static_args(module, args, batch, dynamic) if any(dynamic) else args
            else:  # export fixed the batch size: convert again at this one
                bargs = _static_args(module, args, batch, None)
                start = time.perf_counter()
                bjm = to_jax(model, bargs)
                row.convert_s, row.note = time.perf_counter() - start, "batch fixed: converted at this batch"
            rows.append(_timed_row(row, model, bjm, [bargs], ns, ns.warmup))
        except Exception as exc:  # one failing batch size must not hide the other
            row.error = _one_line(exc)
            rows.append(row)
    return rows


def bench_dynn(entry: Entry, model: Any, args: tuple, module: Any, ns: argparse.Namespace) -> list[Row]:
    start = time.perf_counter()
    jm = to_jax(model, args)
    row = Row(entry.name, entry.kind, 1, time.perf_counter() - start)
    cases = extra_cases(module, ns.cases) or [args]
    row.note = f"{len(cases)} inputs"
    # every input is warmed up once, so a new input shape never compiles inside the timed runs
    return [_timed_row(row, model, jm, cases, ns, ns.warmup + len(cases))]


def bench_entry(entry: Entry, ns: argparse.Namespace) -> list[Row]:
    try:
        module, fn = load_entry(str(entry.path))
        model, args = call_example(fn)
        model.eval()
        if entry.kind == "static":
            return bench_static(entry, model, args, module, ns)
        return bench_dynn(entry, model, args, module, ns)
    except Exception as exc:  # report the failure in the table and go on with the next model
        return [Row(entry.name, entry.kind, error=_one_line(exc))]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def render(rows: list[Row], gm: float | None, console: Console) -> None:
    table = Table(title="torch eager vs dycl_jax (1 thread each)", title_justify="left")
    table.add_column("model", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    for name in ("batch", "convert s", "compile s", "torch ms", "jax ms", "torch/jax", "max|diff|"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("note", overflow="fold")
    errors = []
    for r in rows:
        if r.error:
            errors.append(f"{r.model}: {r.error}")
        table.add_row(
            r.model, r.kind, _fmt(r.batch, "d"), _fmt(r.convert_s, ".2f"), _fmt(r.compile_s, ".2f"),
            _fmt(r.torch_ms, ".3f"), _fmt(r.jax_ms, ".3f"), _fmt(r.ratio, ".2f"), _fmt(r.max_abs_diff, ".1e"),
            Text(f"error {len(errors)} (below)", style="red") if r.error else Text(r.note),
        )
    console.print(table)
    for i, text in enumerate(errors, 1):
        console.print(Text(f"error {i}: {text}", style="red"))
    count = sum(r.ratio is not None for r in rows)
    console.print(f"geometric mean of torch/jax: {_fmt(gm, '.2f') or 'n/a'} over {count} rows (> 1: JAX faster)")
    console.print(
        f"JAX CPU dispatch: {'asynchronous (worker thread)' if ASYNC_DISPATCH else 'inline (caller thread)'}; "
        f"CPU cores used: {sorted(os.sched_getaffinity(0))}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dynn", action="store_true", help="also the dynamic-network examples in examples/dynn")
    p.add_argument("--only", metavar="NAME", help="only the example with this file stem")
    p.add_argument("--runs", type=int, default=50, help="timed paired runs per row (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="untimed paired runs first (default 5)")
    p.add_argument("--cases", type=int, default=16, help="inputs(n) per DyNN example (default 16)")
    p.add_argument("--file", action="append", default=[], metavar="PATH", help="also this static example file")
    p.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    p.add_argument(
        "--async-dispatch", action="store_true", help="keep JAX's default asynchronous CPU dispatch (see above)"
    )
    p.add_argument("--no-pin", action="store_true", help="do not pin the process to one CPU core")
    ns = p.parse_args(argv)
    console = Console()
    if not console.is_terminal:  # piped or redirected: no terminal width to fit, keep the table whole
        console = Console(width=max(console.width, 150))
    entries = discover(ns.dynn, ns.only) + [Entry(Path(f).stem, "static", Path(f)) for f in ns.file]
    if not entries:
        console.print("no example models found" + (f" named {ns.only}" if ns.only else ""))
        return 2
    rows: list[Row] = []
    for entry in entries:
        with console.status(f"{entry.kind} {entry.name}"):
            rows += bench_entry(entry, ns)
    gm = geomean([r.ratio for r in rows if r.ratio])
    render(rows, gm, console)
    if ns.json:
        meta = {"torch": torch.__version__, "jax": jax.__version__, "runs": ns.runs, "warmup": ns.warmup,
                "xla_flags": os.environ["XLA_FLAGS"], "torch_threads": torch.get_num_threads(),
                "jax_cpu_async_dispatch": ASYNC_DISPATCH, "cpus": sorted(os.sched_getaffinity(0))}
        Path(ns.json).write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows], "geomean": gm}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
