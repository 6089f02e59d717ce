"""Differential fuzzer: random dynamic PyTorch modules, converted and compared with torch eager.

    python scripts/fuzz.py --seeds 0:200          # a fixed seed range
    python scripts/fuzz.py --minutes 30           # a long campaign from a random start
    python scripts/fuzz.py --show SEED            # print one program

Each seed makes one module: a few Linear layers and a random `forward` built from control
flow on tensor values (nested if/elif/else, early returns inside loops, break/continue in
static `for` loops, bounded tensor-conditioned `while`), Python counters beside tensor
counters, int64 index arithmetic, Python lists appended on some paths, and `and`/`or` in
tests. The oracle converts it with `host="auto"` and compares `jm(x)` with the ORIGINAL
module on inputs at several scales and signs (so predicates go both ways): floats within
1e-4, integers exactly. A located `DyclError` is an accepted outcome (a refusal); any other
exception or any difference is a bug, printed with its program.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import io
import random
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import dycl_jax  # noqa: E402
from dycl_jax.errors import DyclError  # noqa: E402

N_LAYERS = 3
WIDTH = 6
SCALES = (0.05, 0.3, 1.0, 3.0, -0.3, -1.0, -3.0, 10.0)
RTOL, ATOL = 1e-4, 1e-4


# ---------------------------------------------------------------- program generation

class _Gen:
    """Random statements over a fixed set of variables whose types never change:
    h, v (float [2, WIDTH]), s (Python int), cnt (int64 0-d tensor), outs (list of 0-d floats)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.loop_vars = 0

    def expr(self) -> str:
        r = self.rng
        k = r.randrange(N_LAYERS)
        c = r.choice(["0.5", "1.5", "-0.25", "2.0"])
        return r.choice([
            f"self.l{k}(h)", "torch.tanh(h)", "torch.relu(h) - 0.1", f"h * {c}", "h + v",
            # (never `h - h.mean()`: its sum is 0 up to rounding, so a test of it against 0 would
            # compare float noise, where XLA and torch may round differently)
            "h - h.mean() * 0.5", f"self.l{k}(v) * 0.5 + h", "torch.sigmoid(h) * v",
        ])

    def pred(self, depth: int = 0) -> str:
        r = self.rng
        c = r.choice(["0.0", "0.5", "-0.5", "1.0", "2.0", "-1.5"])
        simple = [
            f"h.sum() > {c}", f"h.mean() < {c}", f"(h > 0).sum() > {r.randrange(1, 2 * WIDTH)}",
            f"h.abs().max().item() > {c.lstrip('-')}", f"v.sum() < {c}", f"cnt > {r.randrange(0, 3)}",
            f"s > {r.randrange(0, 3)}", f"h[0, {r.randrange(WIDTH)}] > {c}",
        ]
        if depth == 0 and r.random() < 0.25:
            op = r.choice(["and", "or"])
            return f"{self.pred(1)} {op} {self.pred(1)}"
        if depth == 0 and r.random() < 0.1:
            return f"not {self.pred(1)}"
        return r.choice(simple)

    def simple(self) -> str:
        r = self.rng
        k = r.random()
        if k < 0.45:
            return f"h = {self.expr()}"
        if k < 0.6:
            return f"v = {self.expr()}"
        if k < 0.7:
            return "s += 1"
        if k < 0.8:
            return "cnt = cnt + 1"
        if k < 0.9:
            return "outs.append(h.sum())"
        return f"cnt = (h.argmax() * {r.choice([3, 7, 1000003])} + cnt) % {r.choice([5, 11, 1009])}"

    def block(self, depth: int, in_loop: bool, n: int | None = None) -> list[str]:
        r = self.rng
        lines: list[str] = []
        for _ in range(n if n is not None else r.randint(1, 2)):
            k = r.random()
            if depth >= 2 or k < 0.45:
                lines.append(self.simple())
            elif k < 0.65:
                lines.extend(self.if_chain(depth, in_loop))
            elif k < 0.78:
                lines.extend(self.static_for(depth))
            elif k < 0.88:
                lines.extend(self.bounded_while(depth))
            elif k < 0.94:
                lines.append(f"if {self.pred()}:")
                lines.append("    return h * 2.0, s, cnt, len(outs)")
            elif in_loop:
                lines.append(f"if {self.pred()}:")
                lines.append("    " + r.choice(["break", "continue"]))
            else:
                lines.append(self.simple())
        return lines

    def if_chain(self, depth: int, in_loop: bool) -> list[str]:
        r = self.rng
        lines = [f"if {self.pred()}:"] + _indent(self.block(depth + 1, in_loop))
        for _ in range(r.choice([0, 0, 1, 2])):
            lines += [f"elif {self.pred()}:"] + _indent(self.block(depth + 1, in_loop))
        if r.random() < 0.6:
            lines += ["else:"] + _indent(self.block(depth + 1, in_loop))
        return lines

    def static_for(self, depth: int) -> list[str]:
        name = self.rng.choice(["i", "j", "_"])  # reused names on purpose
        return [f"for {name} in range({self.rng.randint(1, 3)}):"] + _indent(self.block(depth + 1, True))

    def bounded_while(self, depth: int) -> list[str]:
        self.loop_vars += 1
        n = f"n{self.loop_vars}"
        # the counter advances first, so no `continue` can skip it and the loop always ends
        body = [f"{n} = {n} + 1"] + self.block(depth + 1, True) + ["h = h * 0.9 + 0.05"]
        return [f"{n} = torch.zeros((), dtype=torch.long)",
                f"while {self.pred(1)} and {n} < {self.rng.randint(1, 4)}:"] + _indent(body)


def _indent(lines: list[str]) -> list[str]:
    return ["    " + ln for ln in lines]


def program(seed: int) -> str:
    """The source of module class `Fuzzed` for this seed."""
    gen = _Gen(random.Random(seed))
    body = ["v = h * 0.5", "s = 0", "cnt = torch.zeros((), dtype=torch.long)", "outs = []"]
    body += gen.block(0, False, n=gen.rng.randint(2, 5))
    body += ["total = torch.stack(outs).sum() if outs else h.sum() * 0.0",
             "return h + total, s, cnt, len(outs)"]
    layers = [f"        self.l{k} = nn.Linear({WIDTH}, {WIDTH})" for k in range(N_LAYERS)]
    return "\n".join([
        "import torch", "import torch.nn as nn", "", "",
        "class Fuzzed(nn.Module):", "    def __init__(self):", "        super().__init__()", *layers, "",
        "    def forward(self, h):", *_indent(_indent(body)), "",
    ])


def build(seed: int, folder: Path, source: str | None = None) -> torch.nn.Module:
    """The module of this seed (or of `source`, a saved program), written to a file (conversion
    reads the source), with weights seeded by `seed`."""
    path = folder / f"fuzz_{seed}.py"
    path.write_text(source if source is not None else program(seed))
    namespace: dict[str, Any] = {"__name__": f"fuzz_{seed}", "__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    torch.manual_seed(seed)
    return namespace["Fuzzed"]().eval()


def inputs(seed: int) -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(2, WIDTH, generator=g) * s,) for s in SCALES]


# ---------------------------------------------------------------- oracle

@dataclass
class Outcome:
    seed: int
    kind: str  # "match", "refused", "invalid" (torch itself fails), "numeric" (see _rounding_sensitive), "bug"
    host: str = ""
    detail: str = ""
    paths: set = field(default_factory=set)


def _same(want: Any, got: Any) -> str | None:
    w_leaves, g_leaves = _leaves(want), _leaves(got)
    if len(w_leaves) != len(g_leaves):
        return f"{len(g_leaves)} outputs, torch has {len(w_leaves)}"
    for i, (w, g) in enumerate(zip(w_leaves, g_leaves)):
        w = w.detach().numpy() if isinstance(w, torch.Tensor) else np.asarray(w)
        g = np.asarray(g)
        if w.shape != g.shape:
            return f"output {i}: shape {g.shape} vs torch {w.shape}"
        if w.dtype.kind == "f":
            if not np.allclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True):
                return f"output {i}: max |diff| {np.nanmax(np.abs(g - w)):.3g}"
        elif not np.array_equal(g.astype(np.int64), w.astype(np.int64)):
            return f"output {i}: {g.tolist()} vs torch {w.tolist()}"
    return None


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, (tuple, list)):
        return [leaf for v in x for leaf in _leaves(v)]
    return [x]


def check(seed: int, folder: Path, source: str | None = None) -> Outcome:
    """Convert the seed's module (or `source`) and compare it with torch on every input."""
    model = build(seed, folder, source)
    ins = inputs(seed)
    try:
        with torch.no_grad():
            expected = [model(*a) for a in ins]
    except Exception as exc:  # noqa: BLE001  (the generator made a program torch rejects)
        return Outcome(seed, "invalid", detail=f"{type(exc).__name__}: {exc}")
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            jm = dycl_jax.to_jax(model, ins[0])
            got = [jm(*a) for a in ins]
    except DyclError as exc:
        located = exc.location is not None and exc.location.file.endswith(f"fuzz_{seed}.py")
        kind = "refused" if located else "bug"
        return Outcome(seed, kind, detail=("" if located else "unlocated DyclError: ") + str(exc).splitlines()[0])
    except Exception:  # noqa: BLE001  (anything else escaping dycl_jax is a bug)
        return Outcome(seed, "bug", detail=traceback.format_exc(limit=-3))
    paths = {str([np.asarray(v).tolist() for v in _leaves(w)[1:]]) for w in expected}
    for k, (w, g) in enumerate(zip(expected, got)):
        diff = _same(w, g)
        if diff and _rounding_sensitive(model, ins[k], w):
            return Outcome(seed, "numeric", jm.host, f"input {k}: {diff}; torch float64 disagrees with float32", paths)
        if diff:
            return Outcome(seed, "bug", jm.host, f"input {k} (scale {SCALES[k]}): {diff}", paths)
    return Outcome(seed, "match", jm.host, "", paths)


def _rounding_sensitive(model: torch.nn.Module, args: tuple, want: Any) -> bool:
    """Whether torch's own answer changes when computed in float64: then a decision or an
    argmax sits on a float tie or threshold (tanh saturating to 1.0 one ulp apart, say), where
    any two float32 implementations may differ. Such a program is counted apart, not as a bug."""
    wide = copy.deepcopy(model).double()
    with torch.no_grad():
        again = wide(*[a.double() for a in args])
    return _same(want, _leaves(again)) is not None


def campaign(seeds: list[int], folder: Path, deadline: float | None = None, verbose: bool = True) -> list[Outcome]:
    results = []
    for seed in seeds:
        if deadline is not None and time.time() > deadline:
            break
        out = check(seed, folder)
        results.append(out)
        if verbose and out.kind == "bug":
            print(f"--- BUG seed {seed} ({out.host}): {out.detail}\n{program(seed)}", flush=True)
    return results


def summary(results: list[Outcome]) -> str:
    kinds = {k: sum(r.kind == k for r in results) for k in ("match", "refused", "invalid", "numeric", "bug")}
    hosts = {h: sum(r.host == h for r in results if r.kind == "match") for h in ("staged", "dispatch")}
    return (f"{len(results)} programs: {kinds['match']} match (staged {hosts['staged']}, dispatch "
            f"{hosts['dispatch']}), {kinds['refused']} refused with a located error, {kinds['invalid']} "
            f"invalid (torch fails), {kinds['numeric']} rounding-sensitive (torch float64 disagrees with "
            f"float32), {kinds['bug']} bugs")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0:50", help="a:b, the seed range")
    ap.add_argument("--minutes", type=float, default=None, help="run from a random start until this much time passed")
    ap.add_argument("--show", type=int, default=None, help="print the program of one seed")
    ap.add_argument("--dir", default=None, help="where the generated module files go (default: a temp dir)")
    args = ap.parse_args()
    if args.show is not None:
        print(program(args.show))
        return
    import tempfile
    folder = Path(args.dir or tempfile.mkdtemp(prefix="dycl_fuzz_"))
    folder.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    if args.minutes is not None:
        start = random.randrange(10**6, 10**9)
        results = campaign(list(range(start, start + 10**6)), folder, time.time() + 60 * args.minutes)
    else:
        a, b = (int(v) for v in args.seeds.split(":"))
        results = campaign(list(range(a, b)), folder)
    print(summary(results))
    bugs = [r.seed for r in results if r.kind == "bug"]
    if bugs:
        print("bug seeds:", bugs)
        sys.exit(1)


if __name__ == "__main__":
    main()
