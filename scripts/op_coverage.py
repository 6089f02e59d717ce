"""Prints which PyTorch OpInfo entries convert correctly with dycl_jax (the data behind the coverage goals).

Usage: python scripts/op_coverage.py [--only NAME ...] [--all | --selection] [--samples N] [--json PATH]

Without a flag it runs the ordinary-models list (tests/opinfo_entries.py, goal 90%);
`--selection` runs the wide selection of tests/opinfo_selection.py (nn.functional, linalg,
elementwise, reduction, indexing, shape and sorting entries; goal 97%); `--all` runs op_db.
An entry without float32 CPU samples runs in the first dtype of _FALLBACK_DTYPES it has.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from collections import Counter
from pathlib import Path

# The OpInfo harness is test code and stays out of the package; reuse it from tests/.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from rich.console import Console  # noqa: E402
from rich.markup import escape  # noqa: E402
from rich.table import Table  # noqa: E402

from opinfo_entries import GROUP_OF, ORDINARY  # noqa: E402
from opinfo_known_failures import KNOWN_FAILURES  # noqa: E402
from opinfo_selection import classify, selection  # noqa: E402
from opinfo_support import (  # noqa: E402
    FAIL, NOT_COMPARABLE, NOT_EXPORTABLE, PASS, SAMPLES_PER_ENTRY, EntryResult, SampleResult, entry_id, op_db,
    run_entry, run_samples,
)

KNOWN, UNEXPECTED_PASS = "known failure", "unexpected pass"
# a sample that "passes" because the dispatch host ran the op in torch tested no lowering
IN_TORCH = "ran in torch"
_STYLE = {
    PASS: "green", UNEXPECTED_PASS: "magenta", KNOWN: "yellow", IN_TORCH: "red",
    NOT_EXPORTABLE: "blue", NOT_COMPARABLE: "cyan", FAIL: "red",
}
_MISSING_OP = re.compile(r"no JAX lowering for ATen operator (\S+)")
Row = tuple[tuple[str, str], EntryResult, str]
_CLASS: dict[tuple[str, str], str] = {}  # the wide selection's class of each entry
_FALLBACK_DTYPES = ("complex64", "int64", "int32", "uint8", "bool", "float16")


def _dtype_of(key: tuple[str, str]) -> str | None:
    """float32 where the entry has CPU samples in it, else the first fallback dtype it has."""
    import torch

    info = op_db()[key]
    for name in ("float32",) + _FALLBACK_DTYPES:
        if info.supports_dtype(getattr(torch, name), "cpu"):
            return name
    return None


def _run(key: tuple[str, str], limit: int) -> EntryResult:
    """_run_in_dtype, with a crash of the harness itself recorded as the entry's failure."""
    start = time.perf_counter()
    try:
        return _run_in_dtype(key, limit)
    except Exception as exc:  # noqa: BLE001  (one entry's crash must not end a sweep of hundreds)
        result = EntryResult(key, [SampleResult(FAIL, f"harness crashed: {type(exc).__name__}: {exc}")])
        result.seconds = time.perf_counter() - start
        return result


def _run_in_dtype(key: tuple[str, str], limit: int) -> EntryResult:
    """run_entry, in the entry's dtype (float32 unless it has no float32 samples)."""
    import itertools
    import zlib

    import torch

    dtype = _dtype_of(key)
    if dtype == "float32":
        return run_entry(key, limit)
    start = time.perf_counter()
    result = EntryResult(key)
    if dtype is None:
        result.samples.append(SampleResult(NOT_EXPORTABLE, "the OpInfo has no CPU dtype dycl_jax holds"))
        return result
    info = op_db()[key]
    torch.manual_seed(zlib.crc32(entry_id(key).encode()))
    try:
        samples = list(itertools.islice(info.sample_inputs("cpu", getattr(torch, dtype), requires_grad=False), limit))
    except Exception as exc:
        result.samples.append(SampleResult(NOT_EXPORTABLE, f"OpInfo sample generation fails: {exc}"))
        samples = []
    result.samples.extend(run_samples(info.op, samples))
    result.seconds = time.perf_counter() - start
    return result


_MADE: list = []  # the JaxModels converted while one entry runs


def _watch_conversions() -> None:
    """Record every model the harness converts, to find statements the dispatch host ran in torch."""
    import dycl_jax

    convert = dycl_jax.to_jax

    def to_jax(*args, **kwargs):
        jm = convert(*args, **kwargs)
        _MADE.append(jm)
        return jm

    dycl_jax.to_jax = to_jax


def _ran_in_torch() -> list[str]:
    """Host statements that called the op itself in torch: the harness's op call (`self.op(...)`,
    or a batched sample `part(...)`). Its other host statements (loops over the samples'
    tensors) are plain Python and test nothing either way."""
    found = [s for jm in _MADE if jm.host == "dispatch" for s in jm.report().host_statements
             if "self.op(" in s or "part(" in s]
    _MADE.clear()
    return found


def _verdict(key: tuple[str, str], status: str) -> str:
    """The status as the test sees it: a listed failure is expected, a listed pass is not."""
    if key in KNOWN_FAILURES:
        return UNEXPECTED_PASS if status == PASS else KNOWN
    return status


def _select(only: list[str], run_all: bool, wide: bool) -> list[tuple[str, str]]:
    keys = selection(op_db()) if wide else list(ORDINARY)
    if run_all:
        keys += sorted(k for k in op_db() if k not in set(ORDINARY))
    if only:
        wanted = set(only)
        keys = [k for k in keys if k[0] in wanted or entry_id(k) in wanted]
        if not keys:
            sys.exit(f"no OpInfo entry named {', '.join(only)} (use the name, or name.variant)")
    return keys


def _table(rows: list[Row], samples: int) -> Table:
    table = Table(title=f"OpInfo float32 samples through to_jax (first {samples} per entry)")
    for col in ("entry", "group", "status", "pass", "not exp.", "not comp.", "fail", "s", "first problem"):
        table.add_column(col, overflow="fold")
    for key, result, verdict in rows:
        counts = Counter(s.status for s in result.samples)
        problem = next((s.detail for s in result.samples if s.status == FAIL), "")
        if not problem and verdict in (NOT_EXPORTABLE, NOT_COMPARABLE):
            problem = result.samples[0].detail if result.samples else ""
        if verdict in (KNOWN, UNEXPECTED_PASS):
            problem = f"[side table] {KNOWN_FAILURES[key]}" + (f" | {problem}" if problem else "")
        numbers = [str(counts[s]) for s in (PASS, NOT_EXPORTABLE, NOT_COMPARABLE, FAIL)]
        table.add_row(
            entry_id(key), GROUP_OF.get(key) or _CLASS.get(key, "(other)"), f"[{_STYLE[verdict]}]{verdict}",
            *numbers, f"{result.seconds:.1f}", escape(problem[:160]),  # details hold brackets, not markup
        )
    return table


def _missing_ops(result: EntryResult) -> set[str]:
    found = (_MISSING_OP.search(s.detail) for s in result.samples if s.status == FAIL)
    return {m.group(1) for m in found if m}


def _summary(console: Console, rows: list[Row], wide: bool) -> None:
    if wide:
        _wide_summary(console, rows)
    ordinary = [v for k, _, v in rows if k in set(ORDINARY)]
    totals = Counter(ordinary)
    console.print("ordinary-models entries: " + ", ".join(f"{n} {v}" for v, n in totals.most_common()))
    if ordinary:
        passed = totals[PASS] + totals[UNEXPECTED_PASS]
        console.print(
            f"[bold]pass rate on the ordinary-models list: {passed}/{len(ordinary)} = {passed / len(ordinary):.1%}"
            f"[/bold] (goal 90%; the list has {len(ORDINARY)} entries)"
        )
    missing = Counter(op for _, r, _ in rows for op in _missing_ops(r))
    if missing:
        blocked = ", ".join(f"{o} ({n})" for o, n in missing.most_common())
        console.print(f"missing lowerings (entries blocked): {escape(blocked)}")


def _wide_summary(console: Console, rows: list[Row]) -> None:
    """The share of the wide selection that passes, per class and in all."""
    chosen = set(selection(op_db()))
    picked = [(k, v) for k, _, v in rows if k in chosen]
    passed = [k for k, v in picked if v in (PASS, UNEXPECTED_PASS)]
    by_class = Counter(_CLASS[k] for k, _ in picked)
    ok_class = Counter(_CLASS[k] for k in passed)
    console.print("per class: " + ", ".join(f"{c} {ok_class[c]}/{n}" for c, n in sorted(by_class.items())))
    if picked:
        console.print(
            f"[bold]pass rate on the wide selection: {len(passed)}/{len(picked)} = {len(passed) / len(picked):.1%}"
            f"[/bold] (goal 97%); not passing: {', '.join(entry_id(k) for k, v in picked if k not in set(passed))}"
        )


def _to_json(rows: list[Row]) -> list[dict]:
    return [
        {
            "name": k[0], "variant": k[1], "ordinary": k in set(ORDINARY), "status": v, "seconds": round(r.seconds, 3),
            "samples": [{"status": s.status, "detail": s.detail} for s in r.samples],
        }
        for k, r, v in rows
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="an OpInfo name or name.variant")
    parser.add_argument("--all", action="store_true", help="also run every other op_db entry (slow)")
    parser.add_argument("--selection", action="store_true", help="the wide selection (tests/opinfo_selection.py)")
    parser.add_argument("--samples", type=int, default=SAMPLES_PER_ENTRY, help="samples per entry")
    parser.add_argument("--json", metavar="PATH", help="write the per-entry results as JSON")
    opts = parser.parse_args(argv)

    # torch.export logs a warning (with the whole graph) for each value-dependent shape it meets
    logging.getLogger("torch").setLevel(logging.ERROR)
    import dycl_jax.lower.ops  # noqa: F401  (registers every lowering)
    from dycl_jax.lower.registry import registered

    # a wide table stays readable when the output goes to a file or a CI log
    console = Console(width=None if sys.stdout.isatty() else 200)
    _CLASS.update(classify(op_db()))
    _watch_conversions()
    keys = _select(opts.only, opts.all, opts.selection)
    start = time.perf_counter()
    rows: list[Row] = []
    with console.status("") as status:
        for i, key in enumerate(keys):
            status.update(f"[{i + 1}/{len(keys)}] {entry_id(key)}")
            result = _run(key, opts.samples)
            verdict = _verdict(key, result.status)
            in_torch = _ran_in_torch()
            if in_torch and verdict == PASS:
                verdict = IN_TORCH
                result.samples.append(SampleResult(FAIL, "the dispatch host ran in torch: " + " | ".join(in_torch)))
            rows.append((key, result, verdict))
    console.print(_table(rows, opts.samples))
    _summary(console, rows, opts.selection)
    elapsed = time.perf_counter() - start
    console.print(f"registered lowerings: {len(registered())}; {len(rows)} entries in {elapsed:.0f} s")
    if opts.json:
        Path(opts.json).write_text(json.dumps(_to_json(rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
