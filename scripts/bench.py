"""Latency of torch eager vs the converted JAX model for every example, on one CPU core.

    python scripts/bench.py [--dynn [--no-static] [--no-dispatch-models]] [--only NAME] [--runs N] [--warmup K] [--json OUT]

Static examples (examples/*.py) run at batch 1 and 32. With --dynn the dynamic-network
examples (examples/dynn) run at batch 1, cycling over their `inputs(n)`: those that stage
under every host (staged, dispatch, auto), those that need the dispatch host under auto; a
third table counts the dispatch host's region calls and host decisions per forward, and one
line gives its unit costs on tiny programs. Each timed round calls torch and every JAX
variant back to back (the order cycles through all orders), so all see the same machine
state; the tables show medians and their ratios (torch/X > 1: X is faster than torch).

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
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import asdict, dataclass, field, replace  # noqa: E402
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

from _bench_dispatch import HostWork, UnitCosts, host_work, unit_costs  # noqa: E402
from _bench_models import Entry, disagreement, discover, leading_dim, repeat_batch, to_jax_args  # noqa: E402

from dycl_jax import JaxModel, to_jax  # noqa: E402
from dycl_jax.command.bench import interleaved  # noqa: E402
from dycl_jax.command.targets import extra_cases, load_target  # noqa: E402
from dycl_jax.report.parity import compare  # noqa: E402
from dycl_jax.rewrite.api import run_torch_trace  # noqa: E402

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


def _blocking(jm: Callable) -> Callable:
    """`jm` waiting for its results, as the caller of a JAX model must before using them."""
    return lambda *args: jax.block_until_ready(jm(*args))


def paired(
    torch_fn: Callable, jax_fn: Callable, cases: list, jax_cases: list, runs: int, warmup: int
) -> tuple[float, float]:
    """Median seconds of torch and JAX over `runs` alternating calls, after `warmup` of each."""
    t, j = interleaved([torch_fn, _blocking(jax_fn)], [cases, jax_cases], runs, warmup)
    return t, j


def _first_call(jm: Any, jax_args: tuple) -> float:
    start = time.perf_counter()
    jax.block_until_ready(jm(*jax_args))
    return time.perf_counter() - start


def _timed_row(row: Row, model: Any, jm: Any, cases: list, ns: argparse.Namespace, warmup: int) -> Row:
    jax_cases = [to_jax_args(c) for c in cases]
    row.compile_s = _first_call(jm, jax_cases[0])
    with torch.inference_mode():
        outs = [(model(*c), jm(*jc)) for c, jc in zip(cases, jax_cases)]
        row.max_abs_diff = compare(*outs[0])["diff"]
        wrong = next((d for d in (disagreement(*o) for o in outs) if d), "")
        if wrong:  # no speed for a wrong answer
            row.error = f"not timed, outputs differ from torch: {wrong}"
            return row
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


def bench_entry(entry: Entry, ns: argparse.Namespace) -> list[Row]:
    try:
        target = load_target(str(entry.path))
        module, model, args = target.module, target.model, target.args
        model.eval()
        return bench_static(entry, model, args, module, ns)
    except Exception as exc:  # report the failure in the table and go on with the next model
        return [Row(entry.name, entry.kind, error=_one_line(exc))]


# ---------------------------------------------------------------- dynamic networks, per host

DYNN_HOSTS = {"dynn": ("auto", "staged", "dispatch"), "dispatch": ("auto",)}


@dataclass
class HostTime:
    """One host's conversion of a DyNN model and its timings."""

    host: str  # as requested
    resolved: str = ""  # the host to_jax chose
    convert_s: float | None = None
    warm_s: float | None = None  # first call on every input: captures and compiles every path met
    ms: float | None = None
    max_abs_diff: float | None = None  # float outputs, over every input
    mismatches: int = 0  # integer elements differing from torch, or outputs of another shape
    shared: str = ""  # the host whose conversion this one is (auto resolves to the same one)
    error: str = ""


WARM_FIELDS = ("warm_s", "max_abs_diff", "mismatches")


@dataclass
class DynnRow:
    model: str
    kind: str  # "dynn" (stages) or "dispatch" (needs the dispatch host)
    cases: int = 0
    torch_ms: float | None = None
    hosts: dict[str, HostTime] = field(default_factory=dict)
    work: HostWork | None = None  # the dispatch host's work per forward
    # dispatch / staged latency timed as a pair on their own (no torch call between them, whose
    # cache and thread wake-up effects land on whichever JAX call follows it)
    pair_ratio: float | None = None
    error: str = ""

    def ms(self, host: str) -> float | None:
        """Median latency of `host` ("torch" for eager), if measured."""
        return self.torch_ms if host == "torch" else getattr(self.hosts.get(host), "ms", None)

    def ratio(self, num: str, den: str) -> float | None:
        """ms(num) / ms(den), if both were measured."""
        a, b = self.ms(num), self.ms(den)
        return a / b if a is not None and b is not None else None

    def gap_ms(self) -> float | None:
        """Dispatch minus staged latency, if both were measured."""
        dispatch, staged = self.ms("dispatch"), self.ms("staged")
        return dispatch - staged if dispatch is not None and staged is not None else None

    def region_us(self) -> float | None:
        """Mean cost of a dispatch region call: (dispatch - staged latency) / region and island calls."""
        gap, calls = self.gap_ms(), self.work.region_calls + self.work.island_calls if self.work else 0
        return gap * 1e3 / calls if gap is not None and calls else None

    def programs_ratio(self) -> float | None:
        """The dispatch split's compiled programs alone (no host work) over the staged latency."""
        staged = self.ms("staged")
        return self.work.programs_ms / staged if self.work is not None and staged else None


def convert_hosts(
    model: Any, args: tuple, hosts: tuple[str, ...]
) -> tuple[dict[str, HostTime], dict[str, JaxModel]]:
    """Convert once per host; a host that auto already resolved to shares auto's conversion."""
    times: dict[str, HostTime] = {}
    models: dict[str, JaxModel] = {}
    for host in hosts:
        auto = times.get("auto")
        if auto is not None and auto.resolved == host:  # to_jax(host="auto") ran exactly this conversion
            times[host], models[host] = replace(auto, host=host, shared="auto"), models["auto"]
            continue
        t = times[host] = HostTime(host)
        start = time.perf_counter()
        try:
            models[host] = to_jax(model, args, host=host)
            t.resolved = models[host].host
        except Exception as exc:  # one host failing must not hide the others
            t.error = _one_line(exc)
        t.convert_s = time.perf_counter() - start
    return times, models


def warm(t: HostTime, jm: JaxModel, jax_cases: list, refs: list) -> None:
    """Call `jm` once on every input (compiling every path's programs) and check it against torch."""
    start = time.perf_counter()
    outs = [jax.block_until_ready(jm(*c)) for c in jax_cases]
    t.warm_s = time.perf_counter() - start
    checks = [compare(ref, out) for ref, out in zip(refs, outs)]
    t.max_abs_diff = max(c["diff"] for c in checks)
    t.mismatches = sum(c["total"] - c["match"] + len(c["problems"]) for c in checks)
    wrong = [(k, d) for k, d in enumerate(disagreement(r, o) for r, o in zip(refs, outs)) if d]
    if wrong:  # no speed for a wrong answer
        t.error = f"not timed, input {wrong[0][0]} (of {len(wrong)} wrong): outputs differ from torch: {wrong[0][1]}"


def check_decisions(t: HostTime, model: Any, jm: JaxModel, cases: list, jax_cases: list) -> None:
    """A staged program must take torch's path on every input: its decisions (jm.trace) are the
    rewritten torch program's. The dispatch host makes its decisions in Python, from the values
    `warm` has already checked."""
    if jm.host != "staged":
        return
    for k, (case, jax_case) in enumerate(zip(cases, jax_cases)):
        want = run_torch_trace(model, "forward", case, unroll=jm.unroll)[1]  # a padded program's own rewrite
        got = jm.trace(*jax_case)[1]
        if got != want:
            first = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
            t.error = f"not timed, input {k}: decision {first} differs from torch's ({got[first:first + 1]} vs {want[first:first + 1]})"
            return


def bench_hosts(entry: Entry, ns: argparse.Namespace) -> DynnRow:
    """Torch eager vs every host of `entry.kind`, at batch 1 over the example's inputs."""
    row = DynnRow(entry.name, entry.kind)
    try:
        target = load_target(str(entry.path))
        module, model, args = target.module, target.model, target.args
        model.eval()
        cases = extra_cases(module, ns.cases) or [args]
        row.cases = len(cases)
        row.hosts, models = convert_hosts(model, args, DYNN_HOSTS[entry.kind])
        jax_cases = [to_jax_args(c) for c in cases]
        ok = [h for h, t in row.hosts.items() if not t.error]
        with torch.inference_mode():
            refs = [model(*c) for c in cases]
            for h in ok:  # auto comes first: a host sharing its conversion shares its warm-up too
                t = row.hosts[h]
                if t.shared:
                    t.warm_s, t.max_abs_diff, t.mismatches = (getattr(row.hosts[t.shared], f) for f in WARM_FIELDS)
                    t.error = row.hosts[t.shared].error
                else:
                    warm(t, models[h], jax_cases, refs)
                    if not t.error:
                        check_decisions(t, model, models[h], cases, jax_cases)
            ok = [h for h in ok if not row.hosts[h].error]
            # a host sharing another's conversion is the same object: timing it again would let
            # whichever of the two runs second find the program and weights the first left in cache
            timed = [h for h in ok if not row.hosts[h].shared]
            medians = interleaved([model] + [_blocking(models[h]) for h in timed],
                                  [cases] + [jax_cases] * len(timed), ns.runs, ns.warmup)
        row.torch_ms = medians[0] * 1e3
        for h, m in zip(timed, medians[1:]):
            row.hosts[h].ms = m * 1e3
        for h in ok:
            if row.hosts[h].shared:
                row.hosts[h].ms = row.hosts[row.hosts[h].shared].ms
        if "staged" in ok and "dispatch" in ok:
            st, dp = interleaved([_blocking(models["staged"]), _blocking(models["dispatch"])], [jax_cases] * 2,
                                 ns.runs, ns.warmup)
            row.pair_ratio = dp / st
        dispatch = next((models[h] for h in ("dispatch", "auto") if h in ok and models[h].host == "dispatch"), None)
        row.work = host_work(dispatch, jax_cases) if dispatch is not None else None
    except Exception as exc:  # report the failure in the table and go on with the next model
        row.error = _one_line(exc)
    return row


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def _errors_below(table_errors: list[str], console: Console) -> None:
    for i, text in enumerate(table_errors, 1):
        console.print(Text(f"error {i}: {text}", style="red"))


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
    _errors_below(errors, console)
    count = sum(r.ratio is not None for r in rows)
    console.print(f"geometric mean of torch/jax: {_fmt(gm, '.2f') or 'n/a'} over {count} rows (> 1: JAX faster)")


def _numbers_table(title: str, first: list[str], numbers: list[str]) -> Table:
    """A table with text columns `first`, right-aligned `numbers`, then a note."""
    table = Table(title=title, title_justify="left")
    for name in first:
        table.add_column(name, no_wrap=True)
    for name in numbers:
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("note", overflow="fold")
    return table


def _note(row: DynnRow, errors: list[str]) -> Text:
    """Inputs and mismatches against torch of one DyNN row; its errors go to `errors`, listed below."""
    bits = [f"{row.cases} inputs"] if row.cases else []
    bits += [f"{t.host}: {t.mismatches} mismatches" for t in row.hosts.values() if t.mismatches and not t.shared]
    note = Text("; ".join(bits))
    found = [row.error] if row.error else [f"host={t.host}: {t.error}" for t in row.hosts.values() if t.error]
    for text in found:
        errors.append(f"{row.model} {text}")
        note.append(f"{'; ' if note.plain else ''}error {len(errors)} (below)", style="red")
    return note


def _max_diff(row: DynnRow) -> float | None:
    diffs = [t.max_abs_diff for t in row.hosts.values() if t.max_abs_diff is not None]
    return max(diffs) if diffs else None


def _pair(row: DynnRow, attr: str, hosts: tuple[str, str]) -> str:
    """`attr` of two hosts as "a / b" (seconds)."""
    return " / ".join(_fmt(getattr(row.hosts.get(h), attr, None), ".2f") or "-" for h in hosts)


def _geomean_line(rows: list[DynnRow], pairs: list[tuple[str, str]]) -> str:
    parts = []
    for num, den in pairs:
        values = [r for r in (row.ratio(num, den) for row in rows) if r]
        parts.append(f"{num}/{den} {_fmt(geomean(values), '.2f') or 'n/a'} ({len(values)})")
    return "geometric means: " + ", ".join(parts)


HOST_RATIOS = [("torch", "staged"), ("torch", "dispatch"), ("dispatch", "staged"), ("torch", "auto")]


def render_hosts(rows: list[DynnRow], ns: argparse.Namespace, console: Console) -> None:
    """DyNN models that stage: torch eager vs staged, dispatch and auto."""
    table = _numbers_table(
        f"DyNN models that stage: torch eager vs each host (batch 1; medians of {ns.runs} rounds over the inputs)",
        ["model"], ["convert s st/dp", "warm s st/dp", "torch ms", "staged ms", "dispatch ms", "auto ms",
                    "auto is", "torch/staged", "torch/dispatch", "dispatch/staged", "paired", "max|diff|"])
    errors: list[str] = []
    for r in rows:
        auto = r.hosts.get("auto")
        table.add_row(
            r.model, _pair(r, "convert_s", ("staged", "dispatch")), _pair(r, "warm_s", ("staged", "dispatch")),
            *(_fmt(r.ms(h), ".3f") for h in ("torch", "staged", "dispatch", "auto")), auto.resolved if auto else "",
            *(_fmt(r.ratio(*q), ".2f") for q in HOST_RATIOS[:3]), _fmt(r.pair_ratio, ".2f"), _fmt(_max_diff(r), ".1e"),
            _note(r, errors))
    console.print(table)
    _errors_below(errors, console)
    console.print(_geomean_line(rows, HOST_RATIOS) + " (torch/X > 1: X faster than torch)")
    alone = [r.pair_ratio for r in rows if r.pair_ratio]
    console.print(f"paired: dispatch/staged timed alone as a pair (no torch call between); geometric mean "
                  f"{_fmt(geomean(alone), '.2f') or 'n/a'} ({len(alone)})")
    console.print("auto resolving to staged shares staged's conversion and its timing")


def render_dispatch(rows: list[DynnRow], ns: argparse.Namespace, console: Console) -> None:
    """DyNN models that need the dispatch host: torch eager vs auto."""
    table = _numbers_table(
        f"DyNN models that need dispatch: torch eager vs host=auto (medians of {ns.runs} rounds over the inputs)",
        ["model", "auto is"], ["convert s", "warm s", "torch ms", "auto ms", "torch/auto", "max|diff|"])
    errors: list[str] = []
    for r in rows:
        t = r.hosts.get("auto", HostTime("auto"))
        table.add_row(
            r.model, t.resolved, _fmt(t.convert_s, ".2f"), _fmt(t.warm_s, ".2f"), _fmt(r.torch_ms, ".3f"),
            _fmt(t.ms, ".3f"), _fmt(r.ratio("torch", "auto"), ".2f"), _fmt(t.max_abs_diff, ".1e"), _note(r, errors))
    console.print(table)
    _errors_below(errors, console)
    console.print(_geomean_line(rows, [("torch", "auto")]))


def render_work(rows: list[DynnRow], console: Console) -> None:
    """The dispatch host's work per forward, and what a region call costs over the staged program."""
    table = _numbers_table(
        "dispatch host per forward (means over the inputs; us/call = (dispatch - staged ms) / (region + island calls))",
        ["model"], ["regions", "islands", "parts", "on host", "captures", "XLA progs", "region calls",
                    "island calls", "decisions", "dispatch-staged ms", "us/call", "programs ms", "programs/staged"])
    for r in rows:
        w = r.work
        if w is None:
            continue
        counts = (w.regions, w.islands, w.parts, w.host_statements, w.captures, w.compilations)
        per_forward = (w.region_calls, w.island_calls, w.decisions)
        table.add_row(r.model, *map(str, counts), *(_fmt(v, ".1f") for v in per_forward),
                      _fmt(r.gap_ms(), ".3f"), _fmt(r.region_us(), ".1f"), _fmt(w.programs_ms, ".3f"),
                      _fmt(r.programs_ratio(), ".2f"), Text(r.kind))
    console.print(table)
    console.print("islands: constructs staged whole inside the dispatch host; parts: regions and islands after "
                  "splitting where torch.export refused; on host: statements run in torch; programs: the compiled "
                  "programs of a forward replayed back to back with its arguments, no host work between (a floor "
                  "for any host that runs this split)")


def render_units(u: UnitCosts, console: Console) -> None:
    """The dispatch host's unit costs, one line."""
    console.print(
        f"unit costs (us, medians, 1-element float32): host read bool(y) {u.predicate_read_us:.1f} | "
        f"jitted call {u.jit_call_us:.1f} | DispatchHost.run_region {u.region_call_us:.1f} | "
        f"one-region dispatch model jm(x) {u.one_region_model_us:.1f}   (x + 1 in each)"
    )


def render_settings(console: Console) -> None:
    console.print(
        f"JAX CPU dispatch: {'asynchronous (worker thread)' if ASYNC_DISPATCH else 'inline (caller thread)'}; "
        f"CPU cores used: {sorted(os.sched_getaffinity(0))}; XLA_FLAGS={os.environ['XLA_FLAGS']!r}; "
        f"torch threads: {torch.get_num_threads()}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dynn", action="store_true", help="also the dynamic-network examples in examples/dynn")
    p.add_argument("--no-static", action="store_true", help="skip the static examples (examples/*.py)")
    p.add_argument("--only", metavar="NAME", help="only the example with this file stem")
    p.add_argument("--no-dispatch-models", action="store_true",
                   help="skip the DyNN examples that need the dispatch host (keeps the dispatch/staged comparison)")
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
        console = Console(width=max(console.width, 190))
    entries = discover(ns.dynn, ns.only) + [Entry(Path(f).stem, "static", Path(f)) for f in ns.file]
    if ns.no_static:
        entries = [e for e in entries if e.kind != "static"]
    if ns.no_dispatch_models:
        entries = [e for e in entries if e.kind != "dispatch"]
    if not entries:
        console.print("no example models found" + (f" named {ns.only}" if ns.only else ""))
        return 2
    started = time.perf_counter()
    rows: list[Row] = []
    dynn: list[DynnRow] = []
    for entry in entries:
        with console.status(f"{entry.kind} {entry.name}"):
            if entry.kind == "static":
                rows += bench_entry(entry, ns)
            else:
                dynn.append(bench_hosts(entry, ns))
    units = unit_costs() if dynn else None
    gm = geomean([r.ratio for r in rows if r.ratio])
    if rows:
        render(rows, gm, console)
    if any(r.kind == "dynn" for r in dynn):
        render_hosts([r for r in dynn if r.kind == "dynn"], ns, console)
    if any(r.kind == "dispatch" for r in dynn):
        render_dispatch([r for r in dynn if r.kind == "dispatch"], ns, console)
    if any(r.work for r in dynn):
        render_work(dynn, console)
    if units is not None:
        render_units(units, console)
    render_settings(console)
    console.print(f"bench wall time: {time.perf_counter() - started:.0f} s")
    if ns.json:
        meta = {"torch": torch.__version__, "jax": jax.__version__, "runs": ns.runs, "warmup": ns.warmup,
                "cases": ns.cases, "xla_flags": os.environ["XLA_FLAGS"], "torch_threads": torch.get_num_threads(),
                "jax_cpu_async_dispatch": ASYNC_DISPATCH, "cpus": sorted(os.sched_getaffinity(0))}
        out = {"meta": meta, "rows": [asdict(r) for r in rows], "geomean": gm, "dynn": [asdict(r) for r in dynn],
               "unit_costs": asdict(units) if units else None}
        Path(ns.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
