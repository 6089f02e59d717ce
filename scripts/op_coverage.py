"""Prints which PyTorch OpInfo entries convert correctly with dycl_jax, in every dtype they support
(the data behind the coverage goals).

Usage: python scripts/op_coverage.py [--only NAME ...] [--all | --selection] [--dtype NAME ...] [--samples N]
                                     [--start N] [--stop M] [--json PATH]

Without a flag it runs the ordinary-models list (tests/opinfo_entries.py, goal 90%);
`--selection` runs the wide selection of tests/opinfo_selection.py (nn.functional, linalg,
elementwise, reduction, indexing, shape and sorting entries; goal 97%); `--all` runs op_db.
An entry with none of the harness's dtypes runs in the first dtype of _FALLBACK_DTYPES it has.
`--start/--stop` run a slice of the chosen entries (positions as in Python's keys[start:stop]), and
`--json` is rewritten after every entry, so a long run that is stopped keeps what it measured.
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
from opinfo_known_failures import KNOWN_FAILURES, listed  # noqa: E402
from opinfo_selection import classify, selection  # noqa: E402
from opinfo_support import (  # noqa: E402
    DTYPES, FAIL, NOT_COMPARABLE, NOT_EXPORTABLE, PASS, EntryResult, dtype_name, entry_id, first, op_db, run_entry,
)

KNOWN, UNEXPECTED_PASS = "known failure", "unexpected pass"
_STYLE = {
    PASS: "green", UNEXPECTED_PASS: "magenta", KNOWN: "yellow",
    NOT_EXPORTABLE: "blue", NOT_COMPARABLE: "cyan", FAIL: "red",
}
_MISSING_OP = re.compile(r"no JAX lowering for ATen operator (\S+)")
Row = tuple[tuple[str, str], EntryResult, str]
_CLASS: dict[tuple[str, str], str] = {}  # the wide selection's class of each entry
_FALLBACK_DTYPES = ("complex64", "uint8", "int8", "int16", "float64")


def _dtypes(key: tuple[str, str], wanted: list[str]) -> list | None:
    """The dtypes to run: those asked for that the entry has; all of DTYPES it has (None) by
    default; for an entry with none of DTYPES, the first fallback dtype it has."""
    import torch

    info = op_db()[key]
    if wanted:
        return [d for d in DTYPES if dtype_name(d) in wanted and info.supports_dtype(d, "cpu")]
    if any(info.supports_dtype(d, "cpu") for d in DTYPES):
        return None
    fallback = [getattr(torch, n) for n in _FALLBACK_DTYPES if info.supports_dtype(getattr(torch, n), "cpu")]
    return fallback[:1]


def _verdict(key: tuple[str, str], result: EntryResult) -> str:
    """The status as the test sees it: a listed failure (of the entry, or of each failing
    dtype) is expected, a listed pass is not."""
    if key in KNOWN_FAILURES:
        return UNEXPECTED_PASS if result.status == PASS else KNOWN
    failing = [d for d in result.dtypes if result.status_of(d) == FAIL]
    if failing and all(listed(key, d) for d in failing):
        return KNOWN
    return result.status


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


def _table(rows: list[Row], samples: int | None) -> Table:
    which = "every sample" if samples is None else f"first {samples} samples"
    table = Table(title=f"OpInfo samples through to_jax ({which} per entry and dtype)")
    for col in ("entry", "group", "status", "pass", "not exp.", "not comp.", "fail", "failing dtypes", "s",
                "first problem"):
        table.add_column(col, overflow="fold")
    for key, result, verdict in rows:
        counts = Counter(s.status for s in result.samples)
        problem = next((f"{s.dtype} {s.index}: {s.detail}" for s in result.samples if s.status == FAIL), "")
        if not problem and verdict in (NOT_EXPORTABLE, NOT_COMPARABLE):
            problem = result.samples[0].detail if result.samples else ""
        failing = [d for d in result.dtypes if result.status_of(d) == FAIL]
        if verdict in (KNOWN, UNEXPECTED_PASS):
            reason = KNOWN_FAILURES.get(key) or listed(key, failing[0])
            problem = f"[side table] {reason}" + (f" | {problem}" if problem else "")
        numbers = [str(counts[s]) for s in (PASS, NOT_EXPORTABLE, NOT_COMPARABLE, FAIL)]
        table.add_row(
            entry_id(key), GROUP_OF.get(key) or _CLASS.get(key, "(other)"), f"[{_STYLE[verdict]}]{verdict}",
            *numbers, " ".join(failing), f"{result.seconds:.1f}", escape(problem[:160]),  # details hold brackets
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
    by_dtype = Counter((s.dtype, s.status) for _, r, _ in rows for s in r.samples)
    for d in map(dtype_name, DTYPES):
        entries = sum(d in r.dtypes for _, r, _ in rows)
        counts = ", ".join(f"{by_dtype[d, st]} {st}" for st in (PASS, FAIL, NOT_EXPORTABLE, NOT_COMPARABLE))
        console.print(f"{d}: {entries} entries, samples: {counts}")
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
            "samples": [{"dtype": s.dtype, "index": s.index, "status": s.status, "detail": s.detail}
                        for s in r.samples],
        }
        for k, r, v in rows
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="an OpInfo name or name.variant")
    parser.add_argument("--all", action="store_true", help="also run every other op_db entry (slow)")
    parser.add_argument("--selection", action="store_true", help="the wide selection (tests/opinfo_selection.py)")
    parser.add_argument("--dtype", action="append", default=[], choices=[dtype_name(d) for d in DTYPES],
                        help="only these dtypes (default: every one an entry supports)")
    parser.add_argument("--samples", type=int, default=None, help="samples per entry and dtype (default: all)")
    parser.add_argument("--start", type=int, default=None, help="first position of the chosen entries to run")
    parser.add_argument("--stop", type=int, default=None, help="position after the last one to run")
    parser.add_argument("--json", metavar="PATH", help="write the per-entry results as JSON (after every entry)")
    opts = parser.parse_args(argv)

    # torch.export logs a warning (with the whole graph) for each value-dependent shape it meets
    logging.getLogger("torch").setLevel(logging.ERROR)
    import dycl_jax.lower.ops  # noqa: F401  (registers every lowering)
    from dycl_jax.lower.registry import registered

    # a wide table stays readable when the output goes to a file or a CI log
    console = Console(width=None if sys.stdout.isatty() else 200)
    _CLASS.update(classify(op_db()))
    keys = _select(opts.only, opts.all, opts.selection)[opts.start:opts.stop]
    start = time.perf_counter()
    rows: list[Row] = []
    with console.status("") as status:
        for i, key in enumerate(keys):
            status.update(f"[{i + 1}/{len(keys)}] {entry_id(key)}")
            result = run_entry(key, _dtypes(key, opts.dtype), first(opts.samples) if opts.samples else None)
            rows.append((key, result, _verdict(key, result)))
            if opts.json:  # rewritten each time so that a stopped run keeps its rows
                Path(opts.json).write_text(json.dumps(_to_json(rows), indent=1))
    console.print(_table(rows, opts.samples))
    _summary(console, rows, opts.selection)
    elapsed = time.perf_counter() - start
    console.print(f"registered lowerings: {len(registered())}; {len(rows)} entries in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
