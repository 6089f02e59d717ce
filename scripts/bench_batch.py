"""Throughput of the DyNN examples at batch 32 and 128: torch eager vs vmap of the staged program.

    python scripts/bench_batch.py [--only NAME] [--batches 32 128] [--runs N] [--warmup K] [--no-dispatch] [--json OUT]

The examples are batch-1 code (`.item()`, `if tensor:`): a batch of B is B samples, each taking
its own path. For every staged example (`examples.dynn.MODELS`, `BOUNDED_MODELS`: row selections
staged as masked dense computations, `CONSTANT_FLAG_MODELS`, and `PADDED_MODELS`: decode loops and
shape-changing branches staged as `host="auto"` converts them, one program whose padded outputs
are trimmed per sample before they are compared; scripts/_bench_models.discover) and each batch
size, one timed round processes the whole batch with

- torch: the original model run sample by sample (its per-sample decisions are the reference),
  and the model on the concatenated batch where that gives each sample its own answer;
- vmap: `jax.jit(jax.vmap(jm.apply, in_axes=(None, 0)))` of the staged program, on the mixed
  batch, with the default batching rule (`lower/batching.py`: a per-sample cond with heavy
  branches loops over the samples, a light one selects); on a uniform batch (B copies of the
  batch's most common path: every cond agrees); and with each rule forced: select (both
  branches, then a select), guarded (a select whose branch runs only when some sample takes
  it) and mapped (a loop over the samples, each through a real cond);
- staged loop: the staged program `jm(x)` called sample by sample (no select at all);
- dispatch: the dispatch host, sample by sample (its decisions are Python's).

Before timing, the vmapped outputs are compared with torch's per sample (floats within
1e-3, integers exactly), and the per-sample decisions of the vmapped traced program (a
`DecisionLog` threaded through the same vmap rule: `jm.trace_batch`) with the rewritten torch
program's, one sample at a time. Of the conds whose predicate is per-sample under vmap, `selects`
counts those that compute both branches for the batch and select, `loops` those that loop over
the samples; `conds` counts those that stay conds.

Settings: pinned to one core, one thread each side (XLA_FLAGS below, torch.set_num_threads(1)),
JAX at its defaults (asynchronous CPU dispatch). Paired medians: a round runs every variant back
to back in an order that cycles.
"""
from __future__ import annotations

import os
import sys

if "--no-pin" not in sys.argv[1:]:  # before torch and jax start their threads
    _core = sys.argv[sys.argv.index("--core") + 1] if "--core" in sys.argv[1:] else None
    os.sched_setaffinity(0, {int(_core) if _core is not None else max(os.sched_getaffinity(0))})
_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_XLA_FLAGS}".strip()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections import Counter  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402
from flax import nnx  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

torch.set_num_threads(1)
warnings.simplefilter("ignore")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _bench_models import disagreement, discover, to_jax_args  # noqa: E402

from dycl_jax import to_jax  # noqa: E402
from dycl_jax.command.bench import interleaved  # noqa: E402
from dycl_jax.command.targets import extra_cases, load_target  # noqa: E402
from dycl_jax.lower.batching import counting, guarded, mapped, selected  # noqa: E402
from dycl_jax.rewrite.api import run_torch_trace  # noqa: E402
from dycl_jax.runtime.decoded import finish  # noqa: E402
from examples.dynn import PADDED_MODELS  # noqa: E402

GOAL = 1.5  # torch eager (sample by sample) / vmapped staged program, at batch 32


@dataclass
class BatchRow:
    model: str
    batch: int
    paths: int = 0  # distinct decision sequences in the batch
    selects: int = 0
    loops: int = 0
    conds: int = 0
    torch_ms: float | None = None  # sample by sample
    torch_batch_ms: float | None = None  # the model on the whole batch, where that is per-sample
    vmap_ms: float | None = None
    loop_ms: float | None = None  # the staged program sample by sample
    uniform_ms: float | None = None
    guarded_ms: float | None = None
    select_ms: float | None = None  # every per-sample cond a select over both branches
    mapped_ms: float | None = None  # every per-sample cond a loop over the samples (lax.map)
    dispatch_ms: float | None = None
    compile_s: float | None = None
    max_abs_diff: float | None = None
    note: str = ""
    error: str = ""

    def ratio(self, den: str) -> float | None:
        d = getattr(self, den)
        return self.torch_ms / d if self.torch_ms is not None and d else None


def stacked(jax_cases: list[tuple]) -> tuple:
    """The batch-1 argument tuples stacked on a new leading axis (vmap's axis)."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *jax_cases)


def sample(tree: Any, i: int) -> Any:
    return jax.tree.map(lambda leaf: leaf[i], tree)


def vmapped(jm: Any, nargs: int) -> Callable:
    return jax.jit(jax.vmap(lambda s, *a: jm.apply(s, *a), in_axes=(None,) + (0,) * nargs))


def torch_decisions(model: Any, cases: list[tuple], unroll: Any = None) -> list[list[tuple]]:
    """The rewritten torch program's decisions, one sample at a time (with `unroll`, a padded
    program's: its decode loop unrolled as the staged program runs it)."""
    return [[tuple(d) for d in run_torch_trace(model, "forward", c, unroll=unroll)[1]] for c in cases]


def batch_semantics(model: Any, cases: list[tuple], refs: list[Any]) -> tuple[tuple | None, str]:
    """The concatenated batch, if the model gives every sample its own answer on it; else why not."""
    leaves = [pytree.tree_flatten(c)[0] for c in cases]
    spec = pytree.tree_flatten(cases[0])[1]
    if not all(isinstance(x, torch.Tensor) and x.dim() >= 1 for x in leaves[0]):
        return None, "arguments are not batchable tensors"
    batch = pytree.tree_unflatten([torch.cat(col) for col in zip(*leaves)], spec)
    try:
        with torch.inference_mode():
            got = pytree.tree_flatten(model(*batch))[0]
    except Exception as exc:  # batch-1 code: `.item()` / `if tensor:` on B elements
        return None, f"on a batch torch raises {type(exc).__name__}"
    want = [pytree.tree_flatten(r)[0] for r in refs]
    if not all(isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == 1 for w in want for x in w):
        return None, "outputs are not per sample (Python values)"
    if any(len({x.shape for x in col}) > 1 for col in zip(*want)) or len({len(w) for w in want}) > 1:
        return None, "output shapes differ between samples"
    cat = [torch.cat(col) for col in zip(*want)]
    same = len(got) == len(cat) and all(
        isinstance(g, torch.Tensor) and g.shape == c.shape
        and (torch.allclose(g, c, rtol=1e-4, atol=1e-4) if c.is_floating_point() else torch.equal(g, c))
        for g, c in zip(got, cat))
    return (batch, "") if same else (None, "on a batch torch decides once for all samples")


def bench_model(name: str, path: Path, ns: argparse.Namespace) -> list[BatchRow]:
    target = load_target(str(path))
    module, model = target.module, target.model.eval()
    # a padded example (a decode loop or shape-changing branch) stages as auto converts it: one
    # program with padded outputs and their lengths, trimmed per sample below (runtime/decoded.py)
    jm = to_jax(model, target.args, host="auto" if name in PADDED_MODELS else "staged")
    if jm.host != "staged":
        raise RuntimeError(f"{name} does not stage (auto chose {jm.host})")
    jmd = None if ns.no_dispatch else to_jax(model, target.args, host="dispatch")
    state = nnx.state(jm.module)
    # a bounded model's selections run as masked dense computations (only its emptiness tests
    # are decisions, counted in `paths`): say where
    bounded = jm.report().bounded_rows
    rows = []
    for b in ns.batches:
        row = BatchRow(name, b)
        if bounded:
            row.note = (f"bounded rows at {', '.join(x.split(': ')[0] for x in bounded)} "
                        "(a non-empty selection computes every row)")
        rows.append(row)
        try:
            _bench_batch(row, model, jm, jmd, state, extra_cases(module, b), ns)
        except Exception as exc:  # one failing batch must not hide the others
            row.error = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
    return rows


def _bench_batch(row: BatchRow, model: Any, jm: Any, jmd: Any, state: Any, cases: list[tuple],
                 ns: argparse.Namespace) -> None:
    with torch.inference_mode():
        refs = [model(*c) for c in cases]
    jax_cases = [to_jax_args(c) for c in cases]
    batch = stacked(jax_cases)
    fn = vmapped(jm, len(batch))
    start = time.perf_counter()
    with counting() as counts:
        out = jax.block_until_ready(fn(state, *batch))
    row.compile_s = time.perf_counter() - start
    row.selects, row.loops, row.conds = counts["select"], counts["loop"], counts["cond"]
    outs = [finish(sample(out, i)) for i in range(len(cases))]
    wrong = [(i, d) for i, d in enumerate(disagreement(r, o) for r, o in zip(refs, outs)) if d]
    if wrong:
        row.error = f"not timed: sample {wrong[0][0]} (of {len(wrong)} wrong) differs from torch: {wrong[0][1]}"
        return
    from dycl_jax.report.parity import compare
    row.max_abs_diff = max(compare(r, o)["diff"] for r, o in zip(refs, outs))
    got, want = jm.trace_batch(*batch)[1], torch_decisions(model, cases, jm.unroll)
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if [tuple(d) for d in g] != w]
    if bad:
        row.error = f"not timed: {len(bad)} samples decide otherwise than torch one at a time (first: {bad[0]})"
        return
    paths = Counter(tuple(w) for w in want)
    row.paths = len(paths)
    common = next(i for i, w in enumerate(want) if tuple(w) == paths.most_common(1)[0][0])
    uniform = jax.tree.map(lambda x: jnp.repeat(x[common:common + 1], len(cases), 0), batch)
    variants = {}
    for name, mode in (("guarded", lambda: _both(selected(), guarded())), ("select", selected), ("mapped", mapped)):
        with mode():
            variants[name] = vmapped(jm, len(batch))
            got_v = jax.block_until_ready(variants[name](state, *batch))
        bad_v = [i for i in range(len(cases)) if disagreement(refs[i], finish(sample(got_v, i)))]
        if bad_v:
            row.error = f"not timed: {name} sample {bad_v[0]} (of {len(bad_v)} wrong) differs from torch"
            return
    guard_fn, select_fn, map_fn = variants["guarded"], variants["select"], variants["mapped"]
    torch_batch, why = batch_semantics(model, cases, refs)
    row.note = "; ".join(n for n in (row.note, why) if n)

    def torch_loop() -> None:
        for c in cases:
            model(*c)

    for c in jax_cases:  # compiled at batch 1 already; checked against torch by tests/test_dynn_e2e.py
        jax.block_until_ready(jm(*c))
    fns: list[Callable] = [torch_loop, lambda: jax.block_until_ready(fn(state, *batch)),
                           lambda: jax.block_until_ready(fn(state, *uniform)),
                           lambda: jax.block_until_ready(guard_fn(state, *batch)),
                           lambda: jax.block_until_ready(select_fn(state, *batch)),
                           lambda: jax.block_until_ready(map_fn(state, *batch)),
                           lambda: jax.block_until_ready([jm(*c) for c in jax_cases])]
    names = ["torch_ms", "vmap_ms", "uniform_ms", "guarded_ms", "select_ms", "mapped_ms", "loop_ms"]
    if torch_batch is not None:
        fns.append(lambda: model(*torch_batch))
        names.append("torch_batch_ms")
    if jmd is not None:
        douts = [jmd(*c) for c in jax_cases]  # captures and compiles every path's regions
        dwrong = [i for i, (r, o) in enumerate(zip(refs, douts)) if disagreement(r, o)]
        if dwrong:
            row.note += f"{'; ' if row.note else ''}dispatch not timed: {len(dwrong)} samples differ"
        else:
            fns.append(lambda: jax.block_until_ready([jmd(*c) for c in jax_cases]))
            names.append("dispatch_ms")
    with torch.inference_mode():
        medians = interleaved(fns, [[()]] * len(fns), ns.runs, ns.warmup)
    for attr, m in zip(names, medians):
        setattr(row, attr, m * 1e3)


@contextlib.contextmanager
def _both(a: Any, b: Any) -> Any:
    with a, b:
        yield


def _fmt(v: float | None, spec: str) -> str:
    return "" if v is None else format(v, spec)


def render(rows: list[BatchRow], ns: argparse.Namespace, console: Console) -> None:
    table = Table(title=f"DyNN throughput: ms per batch (medians of {ns.runs} paired rounds); "
                        f"goal torch/vmap >= {GOAL} at batch 32", title_justify="left")
    for name in ("model", "B", "paths", "selects", "loops", "conds", "torch ms", "torch batch ms", "vmap ms",
                 "uniform ms", "select ms", "guarded ms", "mapped ms", "loop ms", "dispatch ms", "torch/vmap", "goal",
                 "torch/select", "torch/mapped", "torch/loop", "torch/dispatch", "vmap/uniform"):
        table.add_column(name, justify="left" if name == "model" else "right", no_wrap=True)
    table.add_column("note", overflow="fold")
    errors = []
    for r in rows:
        ratio = r.ratio("vmap_ms")
        goal = "" if ratio is None or r.batch != 32 else ("met" if ratio >= GOAL else "MISS")
        note = r.note
        if r.error:
            errors.append(f"{r.model} B={r.batch}: {r.error}")
            note = f"error {len(errors)} (below)"
        table.add_row(
            r.model, str(r.batch), str(r.paths or ""), str(r.selects), str(r.loops), str(r.conds),
            *(_fmt(getattr(r, a), ".2f") for a in ("torch_ms", "torch_batch_ms", "vmap_ms", "uniform_ms",
                                                   "select_ms", "guarded_ms", "mapped_ms", "loop_ms", "dispatch_ms")),
            _fmt(ratio, ".2f"), goal, _fmt(r.ratio("select_ms"), ".2f"), _fmt(r.ratio("mapped_ms"), ".2f"),
            _fmt(r.ratio("loop_ms"), ".2f"), _fmt(r.ratio("dispatch_ms"), ".2f"),
            _fmt(r.vmap_ms / r.uniform_ms if r.vmap_ms and r.uniform_ms else None, ".2f"), note)
    console.print(table)
    for i, text in enumerate(errors, 1):
        console.print(f"error {i}: {text}", style="red")
    for b in ns.batches:
        ratios = [r.ratio("vmap_ms") for r in rows if r.batch == b and r.ratio("vmap_ms")]
        gm = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
        low = min(ratios) if ratios else None
        console.print(f"batch {b}: torch/vmap geometric mean {_fmt(gm, '.2f') or 'n/a'}, lowest "
                      f"{_fmt(low, '.2f') or 'n/a'} over {len(ratios)} models")
    console.print("vmap: the default rule (lower/batching.py: a per-sample cond whose branches hold at least "
                  "MAP_FLOPS flops per sample loops over the samples, others select); select: every per-sample "
                  "cond a select over both branches; guarded: a select whose branch runs only when some sample "
                  "takes it; mapped: every per-sample cond a loop over the samples; uniform: B copies of the "
                  "batch's most common path; loop: the staged program called sample by sample")
    console.print(f"CPU cores: {sorted(os.sched_getaffinity(0))}; XLA_FLAGS={os.environ['XLA_FLAGS']!r}; "
                  f"torch threads: {torch.get_num_threads()}; JAX CPU dispatch at its default (asynchronous)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", metavar="NAME", action="append", help="only this example (repeatable)")
    p.add_argument("--batches", type=int, nargs="+", default=[32, 128])
    p.add_argument("--runs", type=int, default=10, help="timed paired rounds (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    p.add_argument("--no-dispatch", action="store_true", help="skip the dispatch host")
    p.add_argument("--no-pin", action="store_true", help="do not pin the process to one CPU core")
    p.add_argument("--core", type=int, help="the CPU core to pin to (default: the highest one allowed)")
    p.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    ns = p.parse_args(argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=max(console.width, 220))
    entries = [e for e in discover(True) if e.kind == "dynn" and (not ns.only or e.name in ns.only)]
    rows: list[BatchRow] = []
    started = time.perf_counter()
    for e in entries:
        with console.status(e.name):
            try:
                done = bench_model(e.name, e.path, ns)
            except Exception as exc:  # a model that fails to convert is a row, not the end of the run
                done = [BatchRow(e.name, 0, error=f"{type(exc).__name__}: {str(exc).splitlines()[0]}")]
        rows += done
        for r in done:  # progress on stderr, the table at the end
            print(json.dumps(asdict(r)), file=sys.stderr, flush=True)
    render(rows, ns, console)
    console.print(f"bench wall time: {time.perf_counter() - started:.0f} s")
    if ns.json:
        Path(ns.json).write_text(json.dumps({"xla_flags": os.environ["XLA_FLAGS"], "runs": ns.runs,
                                             "rows": [asdict(r) for r in rows]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
