"""Dispatch vs staged latency at batch 1 as the layers widen: where the dispatch host's per-decision cost stops mattering.

    python scripts/bench_widths.py [--only captioning|moe] [--scales 1 4 16] [--runs N] [--warmup K] [--async-dispatch] [--json OUT]

The two DyNN examples whose dispatch host is furthest from staged in scripts/bench.py (the
captioning decoder: one program and one host read per generated word; the top-1 MoE layer: per
expert a mask, a host `nonzero` and the expert on its rows) are built again with every width
multiplied by a scale (scale 1 is the example as bench.py runs it) and timed at batch 1 under
both hosts, paired (the two hosts alternate; no torch call between, as bench.py's "paired"
column). The dispatch host pays a fixed cost per program call and host decision (JAX's call
of a jitted program, reading a value back, the host's Python); staged pays it once per forward.
The ratio therefore falls as the work per program grows, and this script measures where it
crosses 1.5.

Before timing, each host's outputs are compared with the original torch model on every input:
integers (tokens) exactly, floats within 1e-4 relative to their scale. Settings as bench.py:
pinned to one core, one thread per side, JAX's CPU dispatch inline unless --async-dispatch.
"""
from __future__ import annotations

import os
import sys

if "--no-pin" not in sys.argv[1:]:  # before torch and jax start their threads
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_XLA_FLAGS}".strip()
ASYNC_DISPATCH = "--async-dispatch" in sys.argv[1:]

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

jax.config.update("jax_cpu_enable_async_dispatch", ASYNC_DISPATCH)
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

torch.set_num_threads(1)
warnings.simplefilter("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dycl_jax import to_jax  # noqa: E402
from dycl_jax.command.bench import interleaved  # noqa: E402
from dycl_jax.host.dispatch import Compiled  # noqa: E402
from examples.dynn import seeded  # noqa: E402
from examples.dynn import captioning, moe  # noqa: E402


@dataclass
class WidthRow:
    model: str
    scale: int
    widths: str  # the scaled constructor arguments
    params: int
    decisions: float  # host decisions (branch/loop predicates) per forward under dispatch, mean over the inputs
    program_calls: float  # compiled-program calls per forward under dispatch
    staged_us: float
    dispatch_us: float

    @property
    def ratio(self) -> float:
        return self.dispatch_us / self.staged_us


def _captioning(scale: int, n: int) -> tuple[str, torch.nn.Module, list[tuple]]:
    dims = dict(embed_dim=16 * scale, decoder_dim=32 * scale, attention_dim=16 * scale, encoder_dim=32 * scale)
    with seeded(186):  # the example's seed: at scale 1 every caption length occurs
        model = captioning.CaptionModel(max_len=captioning.MAX_LEN, **dims).eval()
    return "embed/decoder/attention/encoder " + "/".join(str(v) for v in dims.values()), model, captioning.inputs(n)


def _moe(scale: int, n: int) -> tuple[str, torch.nn.Module, list[tuple]]:
    d_model, hidden = 16 * scale, tuple(h * scale for h in (8, 16, 32, 64))
    with seeded(0):
        model = moe.MoETokenClassifier(d_model)
        model.moe = moe.SwitchLayer(d_model, hidden)
        model = model.eval()
    # the example's inputs at this width: a shared offset of random strength pulls tokens to one expert
    g = torch.Generator().manual_seed(0)
    cases = []
    for _ in range(n):
        strength = float(torch.empty(()).uniform_(0.0, 2.0, generator=g))
        cases.append((torch.randn(1, 1, d_model, generator=g) * strength + torch.randn(1, 12, d_model, generator=g),))
    return f"d_model {d_model}, experts " + "/".join(map(str, hidden)), model, cases


BUILDERS: dict[str, Callable[[int, int], tuple[str, torch.nn.Module, list[tuple]]]] = {
    "captioning": _captioning, "moe": _moe}


def _check(model: torch.nn.Module, jm: Any, cases: list[tuple], jax_cases: list[tuple], host: str) -> None:
    """Every output equal to torch's: integers exactly, floats within 1e-4 of their scale."""
    for k, (args, jargs) in enumerate(zip(cases, jax_cases)):
        with torch.no_grad():
            ref = model(*args)
        refs = ref if isinstance(ref, tuple) else (ref,)
        outs = jm(*jargs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        for r, o in zip(refs, outs, strict=True):
            r, o = r.numpy(), np.asarray(o)
            if r.shape != o.shape or (r.dtype.kind in "iub" and not np.array_equal(r, o)) or \
                    not np.allclose(r, o, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(r).max(initial=0)))):
                raise SystemExit(f"{host} host differs from torch on input {k}: shapes {r.shape} vs {o.shape}, "
                                 f"max |diff| {np.abs(r.astype(float) - o.astype(float)).max() if r.shape == o.shape else 'n/a'}")


def _counts(jm: Any, jax_cases: list[tuple]) -> tuple[float, float]:
    """Host decisions and program calls per forward of a dispatch model, means over the inputs."""
    calls = [0]
    original = Compiled.run

    def counted(self: Any, *args: Any) -> Any:
        calls[0] += 1
        return original(self, *args)

    reads = [0]
    host = jm._fn
    truth = host.truth

    def read(value: Any) -> bool:
        reads[0] += 1
        return truth(value)

    # (decisions counted as the host reads them: recording them would make every call a traced
    # one, which runs a chunked loop as a host loop, host/chunks.py)
    Compiled.run = counted  # the class attribute for this pass only
    host.truth = read  # an instance attribute shadows the method for this pass only
    try:
        for c in jax_cases:
            jax.block_until_ready(jm(*c))
    finally:
        Compiled.run = original
        del host.truth
    return reads[0] / len(jax_cases), calls[0] / len(jax_cases)


def measure(name: str, scale: int, cases_n: int, runs: int, warmup: int) -> WidthRow:
    widths, model, cases = BUILDERS[name](scale, cases_n)
    jax_cases = [tuple(jax.numpy.asarray(a.numpy()) for a in c) for c in cases]
    staged = to_jax(model, cases[0], host="staged")
    dispatch = to_jax(model, cases[0], host="dispatch")
    for host, jm in (("staged", staged), ("dispatch", dispatch)):
        _check(model, jm, cases, jax_cases, host)  # also compiles every path's programs
    decisions, program_calls = _counts(dispatch, jax_cases)
    fns = [lambda *a, jm=jm: jax.block_until_ready(jm(*a)) for jm in (staged, dispatch)]
    staged_s, dispatch_s = interleaved(fns, [jax_cases, jax_cases], runs * len(jax_cases), warmup * len(jax_cases))
    params = sum(p.numel() for p in model.parameters())
    return WidthRow(name, scale, widths, params, decisions, program_calls, staged_s * 1e6, dispatch_s * 1e6)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=sorted(BUILDERS))
    ap.add_argument("--scales", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--cases", type=int, default=16, help="inputs per model (default 16)")
    ap.add_argument("--runs", type=int, default=20, help="timed rounds over the inputs (default 20)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    ap.add_argument("--async-dispatch", action="store_true", help="keep JAX's default asynchronous CPU dispatch")
    ap.add_argument("--no-pin", action="store_true", help="do not pin the process to one CPU core")
    ap.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    ns = ap.parse_args()
    console = Console(width=200)
    started = time.perf_counter()
    rows = []
    for name in [ns.only] if ns.only else sorted(BUILDERS):
        for scale in ns.scales:
            with console.status(f"{name} at scale {scale}: converting, checking against torch, timing"):
                rows.append(measure(name, scale, ns.cases, ns.runs, ns.warmup))
    table = Table(title="dispatch vs staged at batch 1 by width (medians of paired calls over the inputs)")
    for col in ("model", "scale", "widths", "params", "decisions", "program calls", "staged us", "dispatch us",
                "dispatch/staged", "per call us"):
        table.add_column(col, justify="left" if col in ("model", "widths") else "right")
    for r in rows:
        # the dispatch host's extra time spread over its program calls (what one call and its host work cost)
        per_call = (r.dispatch_us - r.staged_us) / max(r.program_calls - 1, 1)
        table.add_row(r.model, str(r.scale), r.widths, f"{r.params:,}", f"{r.decisions:.1f}",
                      f"{r.program_calls:.1f}", f"{r.staged_us:.0f}", f"{r.dispatch_us:.0f}", f"{r.ratio:.2f}",
                      f"{per_call:.1f}")
    console.print(table)
    console.print("decisions: predicates read on the host (sizes read for `nonzero` not counted); program calls: compiled "
                  "programs run per forward; per call us: (dispatch - staged) / (program calls - 1)")
    mode = "asynchronous (JAX's default)" if ASYNC_DISPATCH else "inline (caller thread)"
    console.print(f"JAX CPU dispatch: {mode}; CPU cores used: {sorted(os.sched_getaffinity(0))}; "
                  f"XLA_FLAGS={os.environ['XLA_FLAGS']!r}; torch threads: {torch.get_num_threads()}; "
                  f"wall time {time.perf_counter() - started:.0f} s")
    if ns.json:
        Path(ns.json).write_text(json.dumps([asdict(r) | {"ratio": r.ratio} for r in rows], indent=1))


if __name__ == "__main__":
    main()
