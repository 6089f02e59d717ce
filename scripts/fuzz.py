"""Differential fuzzer: random dynamic PyTorch modules, converted and compared with torch eager.

    python scripts/fuzz.py --seeds 0:200          # a fixed seed range
    python scripts/fuzz.py --minutes 30           # a long campaign from a random start
    python scripts/fuzz.py --show SEED            # print one program

Each seed makes one module: a few Linear layers, a submodule `Sub` with its own data-dependent
branches, and a random `forward` built from control flow on tensor values (nested
if/elif/else, early returns inside loops, break/continue in static `for` loops, bounded
tensor-conditioned `while`), Python counters beside tensor counters, int64 index arithmetic,
Python lists appended on some paths, `and`/`or` in tests, float16 blocks, and in-place updates
through an alias (`a = v`, then `a.mul_(...)`, `v[:, j] += 1`). Campaigns (not `--plain`, and
not tests/test_fuzz.py's fixed seeds) add views of the first `v` (`w = v[0]`, `v[:, 1:]`,
`.view`, `.transpose`), a list holding it (`xs = [v]`), later in-place updates through any of
these names, dict outputs, and in some programs data-dependent shapes (fuzz_shapes.py: a
sequence grown by `torch.cat`, `nonzero` and mask indexing, `.item()` sizes, host lists, numpy)
or aliases made at run time (fuzz_aliases.py: `a = v` in a branch, objects chosen by a test). The oracle converts it with
`host="auto"` and compares `jm(x)`, `jm.trace(x)` (outputs, and decisions exactly with the
rewritten torch program's) and `jm.apply(state, x)` with the ORIGINAL module on inputs at
several scales and signs (so predicates go both ways): floats within 1e-4 (2e-2 with float16
blocks), integers exactly. A located `DyclError` is an accepted outcome (a refusal); any other
exception or any difference is a bug, printed with its program, unless the program is
rounding-sensitive (see `_compare`).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import io
import random
import re
import signal
import sys
import time
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "scripts"):  # dycl_jax and examples; fuzz_minimise beside this file
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import dycl_jax  # noqa: E402
from dycl_jax.errors import DyclError, raised_by_us  # noqa: E402
from dycl_jax.rewrite.api import run_dispatch_trace, run_torch_trace  # noqa: E402
from dycl_jax.runtime.decoded import finish  # noqa: E402
from fuzz_minimise import Minimised, minimise  # noqa: E402  (scripts/ is on sys.path)
from fuzz_aliases import Rebinds  # noqa: E402
from fuzz_attributes import Attributes  # noqa: E402
from fuzz_shapes import Shapes  # noqa: E402

N_LAYERS = 3
WIDTH = 6
SCALES = (0.05, 0.3, 1.0, 3.0, -0.3, -1.0, -3.0, 10.0)
RTOL = 1e-4  # relative and absolute, on floats; integers exactly
HALF_TOL = 2e-2  # the same for programs with float16 blocks
SHAPE_SHARE = 0.4  # campaign programs with data-dependent shapes (fuzz_shapes.py)
REBIND_SHARE = 0.4  # campaign programs with aliases made at run time (fuzz_aliases.py)
ATTRIBUTE_SHARE = 0.3  # campaign programs with values kept on `self` (fuzz_attributes.py)
APPLY_DISPATCH_INPUTS = 3  # `apply` on the dispatch host runs the regions again: fewer inputs


# ---------------------------------------------------------------- program generation

class _Gen:
    """Random statements over a fixed set of variables whose types never change:
    h, v (float [2, WIDTH]), a (an alias of the first v), s (Python int), cnt (int64 0-d tensor),
    outs (list of 0-d floats). With `sub`, the body of a submodule's own forward: only h, and its
    own layer `self.lin`."""

    def __init__(self, rng: random.Random, sub: bool = False, extra: random.Random | None = None,
                 shapes: Shapes | None = None, rebinds: Rebinds | None = None,
                 attributes: Attributes | None = None) -> None:
        self.rng = rng
        self.sub = sub
        self.attributes = attributes  # values kept on `self` (fuzz_attributes.py), in some campaign programs
        self.shapes = shapes  # data-dependent shapes (fuzz_shapes.py), in some campaign programs
        self.rebinds = rebinds  # aliases made at run time (fuzz_aliases.py), in some campaign programs
        # the view/list-alias/dict features draw from their own stream, so every program that
        # does not use them is the one the seed made before they existed
        self.extra = extra
        self.view = extra.choice([None, None, "v[0]", "v[:, 1:]", "v.view(-1)", "v.transpose(0, 1)"]) if extra else None
        self.listed = bool(extra and extra.random() < 0.25)  # `xs = [v]`, updated through `xs[0]`
        self.as_dict = bool(extra and extra.random() < 0.25)  # forward returns a dict
        # `if p: break/continue/return` inside blocks nested two deep (an inner loop's body, or an
        # if inside it): breaks at both levels of nested loops
        self.deep_jumps = bool(extra and extra.random() < 0.5)
        self.loop_vars = 0
        self.calls_sub = False  # a submodule with its own dynamic branches is called
        self.half = False  # some values go through float16

    def expr(self) -> str:
        r = self.rng
        k = r.randrange(N_LAYERS)
        c = r.choice(["0.5", "1.5", "-0.25", "2.0"])
        if self.sub:
            return r.choice(["self.lin(h)", "torch.tanh(h)", f"h * {c}", "torch.relu(h) - 0.1", "h - h.mean() * 0.5"])
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
            f"h.abs().max().item() > {c.lstrip('-')}", f"h[0, {r.randrange(WIDTH)}] > {c}",
        ]
        if self.sub:
            return r.choice(simple)
        simple += [f"v.sum() < {c}", f"cnt > {r.randrange(0, 3)}", f"s > {r.randrange(0, 3)}"]
        if self.shapes and self.shapes.wanted():
            return self.shapes.pred()
        if self.attributes and self.attributes.wanted():
            return self.attributes.pred()
        if r.random() < 0.08:
            self.half = True
            simple.append(f"h.half().sum() > {c}")  # a test on float16 values
            return simple[-1]
        if depth == 0 and r.random() < 0.25:
            op = r.choice(["and", "or"])
            return f"{self.pred(1)} {op} {self.pred(1)}"
        if depth == 0 and r.random() < 0.1:
            return f"not {self.pred(1)}"
        return r.choice(simple)

    def simple(self) -> str:
        r = self.rng
        if self.sub:
            return f"h = {self.expr()}"
        k = r.random()
        if k < 0.38:
            return f"h = {self.expr()}"
        if k < 0.5:
            return f"v = {self.expr()}"
        if k < 0.57:
            return "s += 1"
        if k < 0.64:
            return "cnt = cnt + 1"
        if k < 0.72:
            return "outs.append(h.sum())"
        if k < 0.8:
            return f"cnt = (h.argmax() * {r.choice([3, 7, 1000003])} + cnt) % {r.choice([5, 11, 1009])}"
        if k < 0.87:
            self.half = True
            return r.choice([  # a float16 block, Python scalars with it included (torch computes those wider)
                f"h = (torch.tanh(h.half() * {r.choice(['1.5', '0.25'])}) + v.half()).float()",
                "h = (h.half() * 0.001).float() * 1000.0",
                "hh = h.half(); hh = hh * hh.mean() - 0.5; h = hh.float() * 0.5 + h",
            ])
        if k < 0.93:
            j = r.randrange(WIDTH)
            return r.choice([  # in-place updates through an alias (`a` is the first `v`) or of `v` itself
                "a.mul_(0.5)", "v.add_(h)", f"a[0, {j}] = h[1, {j}]", f"v[:, {j}] += 1.0", "a.clamp_(-2.0, 2.0)",
            ]) if not self._later_update() else self._later_update_statement(j)
        self.calls_sub = True
        return "h = self.sub(h)"

    def _later_update(self) -> bool:
        return bool(self.extra and (self.view or self.listed) and self.extra.random() < 0.6)

    def _later_update_statement(self, j: int) -> str:
        """An update that a view `w` of the first `v` (or the list `xs` holding it) must see, or
        one made through them that `a` and `v` must see."""
        forms = ["a.add_(h)", "a.mul_(0.5)", f"a[0, {j}] = h[1, {j}]"]
        if self.view:
            forms += ["w.mul_(2.0)", "w += 1.0"]
        if self.listed:
            forms += ["xs[0].add_(h)", "xs[0][1, 0] = h[0, 0]"]
        return self.extra.choice(forms)  # type: ignore[union-attr]

    def outputs(self) -> str:
        """What forward returns (after `return`): a tuple, or a dict of the same values."""
        values = {"y": "h * 2.0", "s": "s", "cnt": "cnt", "n": "len(outs)", "a": "a"}
        if self.view:
            values["w"] = "w * 1.0"
        if self.listed:
            values["x0"] = "xs[0] + 0.0"
        if self.shapes:
            values.update(self.shapes.outputs())
        if self.rebinds:
            values.update(self.rebinds.outputs())
        if self.attributes:
            values.update(self.attributes.outputs())
        if self.as_dict:
            return "{" + ", ".join(f"{k!r}: {v}" for k, v in values.items()) + "}"
        return ", ".join(values.values())

    def ret(self) -> str:
        return "return h * 2.0" if self.sub else f"return {self.outputs()}"

    def block(self, depth: int, in_loop: bool, n: int | None = None) -> list[str]:
        r = self.rng
        lines: list[str] = []
        for _ in range(n if n is not None else r.randint(1, 2)):
            k = r.random()
            if depth >= 2 and self.deep_jumps and k < 0.3:
                lines.append(f"if {self.pred()}:")
                lines.append("    " + (r.choice(["break", "continue", self.ret()]) if in_loop else self.ret()))
            elif depth >= 2 or k < 0.45:
                lines.extend(self.simple_lines())
            elif k < 0.65:
                lines.extend(self.if_chain(depth, in_loop))
            elif k < 0.78 and not self.sub:
                lines.extend(self.static_for(depth))
            elif k < 0.88 and not self.sub:
                lines.extend(self.bounded_while(depth))
            elif k < 0.94 or self.sub:
                lines.append(f"if {self.pred()}:")
                lines.append("    " + self.ret())
            elif in_loop:
                lines.append(f"if {self.pred()}:")
                lines.append("    " + r.choice(["break", "continue"]))
            else:
                lines.extend(self.simple_lines())
        return lines

    def simple_lines(self) -> list[str]:
        """One simple statement, or (with `shapes`) sometimes a data-dependent-shape one."""
        if self.shapes and self.shapes.wanted():
            return self.shapes.statement().split("\n")
        if self.rebinds and self.rebinds.wanted():
            return [self.rebinds.statement(self.pred(1))]
        if self.attributes and self.attributes.wanted():
            return [self.attributes.statement()]
        return [self.simple()]

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


def program(seed: int, extended: bool = False) -> str:
    """The source of module class `Fuzzed` (and of its submodule `Sub`) for this seed; with
    `extended`, also views of `v`, a list holding it and dict outputs (the campaigns' default;
    off, the programs tests/test_fuzz.py's fixed seeds were chosen on)."""
    rng, shape_rng = random.Random(seed), random.Random(f"shapes-{seed}")
    shapes = Shapes(shape_rng) if extended and shape_rng.random() < SHAPE_SHARE else None
    alias_rng = random.Random(f"rebinds-{seed}")
    rebinds = Rebinds(alias_rng) if extended and alias_rng.random() < REBIND_SHARE else None
    attribute_rng = random.Random(f"attributes-{seed}")
    attributes = Attributes(attribute_rng) if extended and attribute_rng.random() < ATTRIBUTE_SHARE else None
    gen = _Gen(rng, extra=random.Random(f"views-{seed}") if extended else None, shapes=shapes, rebinds=rebinds,
               attributes=attributes)
    sub = _Gen(rng, sub=True)
    body = ["v = h * 0.5", "a = v", "s = 0", "cnt = torch.zeros((), dtype=torch.long)", "outs = []"]
    body += [f"w = {gen.view}"] if gen.view else []
    body += ["xs = [v]"] if gen.listed else []
    body += shapes.prelude() if shapes else []
    body += rebinds.prelude() if rebinds else []
    body += attributes.prelude() if attributes else []
    body += gen.block(0, False, n=gen.rng.randint(2, 5))
    final = gen.outputs().replace("h * 2.0", "h + total", 1)
    body += ["total = torch.stack(outs).sum() if outs else h.sum() * 0.0", f"return {final}"]
    sub_body = ["h = self.lin(h)"] + sub.block(1, False, n=2) + ["return h"]
    layers = [f"        self.l{k} = nn.Linear({WIDTH}, {WIDTH})" for k in range(N_LAYERS)]
    return "\n".join([
        *(["import numpy as np"] if shapes and shapes.numpy else []),
        "import torch", "import torch.nn as nn", "", "",
        "class Sub(nn.Module):", "    def __init__(self):", "        super().__init__()",
        f"        self.lin = nn.Linear({WIDTH}, {WIDTH})", "",
        "    def forward(self, h):", *_indent(_indent(sub_body)), "", "",
        "class Fuzzed(nn.Module):", "    def __init__(self):", "        super().__init__()", *layers,
        "        self.sub = Sub()", "",
        *(attributes.methods() if attributes else []),
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
    # "match", "refused" (a located DyclError), "invalid" (torch itself fails), "numeric" (a
    # decision on its threshold or a float tie: see _numeric), "bug"
    kind: str
    host: str = ""
    detail: str = ""
    paths: set = field(default_factory=set)  # distinct decision traces over the inputs
    features: set = field(default_factory=set)  # "float16", "alias", "submodule", "inplace"


def _tolerance(source: str) -> float:
    # float16 blocks: torch and XLA round each op to ~3 digits alike, but a value carried on
    # through float32 layers keeps the difference of one float16 ulp
    return HALF_TOL if ".half()" in source else RTOL


def _same(want: Any, got: Any, tol: float = RTOL, ordered: bool = True) -> str | None:
    """`ordered=False`: a dict's keys may come in another order (`jax.jit` rebuilds a returned
    dict in sorted key order, whatever the function returned), its values are still compared by key."""
    if isinstance(want, dict) and isinstance(got, dict) and not ordered and set(got) == set(want):
        got = {k: got[k] for k in want}
    if isinstance(want, dict) and (not isinstance(got, dict) or list(got) != list(want)):
        keys = list(got) if isinstance(got, dict) else None
        return f"a {type(got).__name__} with keys {keys}, torch has {list(want)}"
    w_leaves, g_leaves = _leaves(want), _leaves(got)
    if len(w_leaves) != len(g_leaves):
        return f"{len(g_leaves)} outputs, torch has {len(w_leaves)}"
    for i, (w, g) in enumerate(zip(w_leaves, g_leaves)):
        w = w.detach().numpy() if isinstance(w, torch.Tensor) else np.asarray(w)
        g = np.asarray(g)
        if w.shape != g.shape:
            return f"output {i}: shape {g.shape} vs torch {w.shape}"
        if w.dtype.kind == "f":
            if not np.allclose(g, w, rtol=tol, atol=tol, equal_nan=True):
                return f"output {i}: max |diff| {np.nanmax(np.abs(g - w)):.3g}"
        elif not np.array_equal(g.astype(np.int64), w.astype(np.int64)):
            return f"output {i}: {g.tolist()} vs torch {w.tolist()}"
    return None


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, dict):
        return [leaf for v in x.values() for leaf in _leaves(v)]
    if isinstance(x, (tuple, list)):
        return [leaf for v in x for leaf in _leaves(v)]
    return [x]


def _features(source: str) -> set:
    main = source.split("class Fuzzed", 1)[-1]
    marks = {"float16": (".half()",), "alias": ("a.mul_", "a.clamp_", "a[0", "a.add_"), "inplace": ("v.add_", "v[:"),
             "submodule": ("self.sub(",), "view": ("w = v",), "list alias": ("xs = [v]",),
             "dict": ("return {",), "shapes": ("seq = h[:, :1]",), "rebinds": ("spare = []",),
             "attributes": ("self.k = 0",)}
    return {k for k, ms in marks.items() if any(m in main for m in ms)}


def _torch_decisions(model: torch.nn.Module, jm: Any, args: tuple) -> list:
    """The decisions the converted program must make: the rewritten torch program's, run eagerly
    (the staged rewrite; on the dispatch host its host decisions, islands that did not stage
    running their host version as there, and islands with aliased names choosing as the host's
    last traced call did: call it after `jm.trace(*args)`)."""
    if jm.host == "dispatch":
        return list(run_dispatch_trace(model, "forward", args, jm._fn.failed_islands(), jm._fn.alias_choices)[1])
    return list(run_torch_trace(model, "forward", args, unroll=jm.unroll)[1])  # (a padded program: its unroll)


def _flip(model: torch.nn.Module, jm: Any, args: tuple, tol: float) -> str | None:
    """Where a decision sat on its threshold and torch and XLA took different sides of it: the
    first decision that differs has a margin (jm.trace) within the float error `tol`."""
    try:
        (_, got), want = jm.trace(*args), _torch_decisions(model, jm, args)
    except Exception:  # noqa: BLE001  (no traces to compare: not a flip)
        return None
    for w, g in zip(want, got):
        if tuple(w) != tuple(g):
            margin = getattr(g, "margin", float("nan"))
            return f"{g[0]} flipped with margin {margin:.2g}" if margin <= tol else None
    return None


def check(seed: int, folder: Path, source: str | None = None, only: Sequence[int] | None = None,
          extended: bool = False) -> Outcome:
    """Convert the seed's module (or `source`) and compare with the ORIGINAL torch module on every
    input: `jm(x)`, `jm.trace(x)` (outputs, and decisions exactly against the rewritten torch
    program's) and `jm.apply(state, x)`. `only`: the indices of `inputs(seed)` to compare on (a
    saved finding's failing inputs and one per path); the conversion takes input 0 either way."""
    source = source if source is not None else program(seed, extended)
    model = build(seed, folder, source)
    ins, tol, features = inputs(seed), _tolerance(source), _features(source)
    picked = list(range(len(ins))) if only is None else sorted(set(only))
    try:
        with torch.no_grad():
            expected = [model(*copy.deepcopy(ins[k])) for k in picked]
    except Exception as exc:  # noqa: BLE001  (the generator made a program torch rejects)
        return Outcome(seed, "invalid", detail=f"{type(exc).__name__}: {exc}", features=features)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            jm = dycl_jax.to_jax(model, ins[0])
            got = [jm(*ins[k]) for k in picked]
            return _compare(seed, model, jm, [(k, ins[k]) for k in picked], expected, got, tol, features)
    except DyclError as exc:
        located = exc.location is not None and exc.location.file.endswith(f"fuzz_{seed}.py")
        ours = raised_by_us(exc)  # a DyclError that chains our own KeyError, NameError, ...: a bug
        kind = "refused" if located and not ours else "bug"
        detail = ("" if located else "unlocated ") + ("internal " if ours else "") + f"{type(exc).__name__}: " \
            + str(exc).splitlines()[0]
        return Outcome(seed, kind, detail=detail, features=features)
    except Exception:  # noqa: BLE001  (anything else escaping dycl_jax is a bug)
        return Outcome(seed, "bug", detail=traceback.format_exc(limit=-4), features=features)


def _compare(seed: int, model: torch.nn.Module, jm: Any, ins: list[tuple[int, tuple]], expected: list, got: list,
             tol: float, features: set) -> Outcome:
    """`ins`: (index in `inputs(seed)`, args) of the inputs compared; `expected`, `got` of each."""
    def out(kind: str, detail: str = "", paths: set | None = None) -> Outcome:
        return Outcome(seed, kind, jm.host, detail, paths or set(), features)

    for (k, a), w, g in zip(ins, expected, got):
        diff = _same(w, g, tol)
        if diff and _rounding_sensitive(model, a, w, tol):
            return out("numeric", f"input {k}: {diff}; torch changes in float64 or with XLA's tanh rounding")
        flip = _flip(model, jm, a, tol) if diff else None
        if flip:
            return out("numeric", f"input {k}: {diff}; {flip}")
        if diff:
            return out("bug", f"input {k} (scale {SCALES[k]}): {diff}")
    paths = set()
    for (k, a), w in zip(ins, expected):
        traced, decisions = jm.trace(*a)
        diff = _same(w, traced, tol)
        if diff:
            return out("bug", f"jm.trace, input {k}: {diff}")
        want = _torch_decisions(model, jm, a)
        if jm.host == "dispatch":
            # a callee's decisions inside a compiled region come from its staged rewrite (an elif
            # chain as one index), in the torch run from its dispatch rewrite (one per test):
            # compare the method's own decisions, as tests/test_dispatch_e2e.py does
            top = {site.label for site in jm._fn.plan.record.functions[0].sites}
            decisions, want = [d for d in decisions if d[0] in top], [d for d in want if d[0] in top]
        if [tuple(d) for d in decisions] != [tuple(d) for d in want]:
            return out("bug", f"jm.trace, input {k}: decisions {[tuple(d) for d in decisions]} vs torch {want}")
        paths.add(tuple(tuple(d) for d in want))
    # apply: staged programs jitted (as users run them under grad), dispatch ones as they come
    apply = jax.jit(jm.apply) if jm.host == "staged" else jm.apply
    state = nnx.state(jm.module)
    for n, ((k, a), w) in enumerate(zip(ins, expected)):
        if jm.host == "dispatch" and n >= APPLY_DISPATCH_INPUTS:
            break
        # (a padded program's apply gives the padded form, as documented: compared trimmed)
        diff = _same(w, finish(apply(state, *[jnp.asarray(t.numpy()) for t in a])), tol, ordered=jm.host != "staged")
        if diff:
            return out("bug", f"jm.apply, input {k}: {diff}")
    return out("match", paths=paths)


def _rounding_sensitive(model: torch.nn.Module, args: tuple, want: Any, tol: float = RTOL) -> bool:
    """Whether torch's own answer changes when computed in float64, or with tanh computed by
    XLA's own tanh (it differs from torch's by an ulp here and there, and is exactly +-1 from
    |x| = 7.905 on, where the correctly rounded float32 value is still 1 - 2**-22 or so): then a
    decision or an argmax sits on a float tie or threshold, where any two float32
    implementations may differ. Such a program is counted apart, not as a bug."""
    wide = copy.deepcopy(model).double()
    with torch.no_grad():
        try:
            again = wide(*[a.double() for a in args])
        except RuntimeError:  # the program casts back itself (`.float()`): no float64 answer to compare
            again = None
        if again is not None and _same(want, _leaves(again), tol) is not None:
            return True
        with _xla_tanh():
            again = model(*copy.deepcopy(args))
    return _same(want, _leaves(again), tol) is not None


@contextlib.contextmanager
def _xla_tanh():
    """torch.tanh computed by XLA (the values jm's programs compute), for the original module."""
    real = torch.tanh

    def tanh(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.array(jnp.tanh(jnp.asarray(x.detach().numpy())))).to(x.dtype)

    torch.tanh = tanh
    try:
        yield
    finally:
        torch.tanh = real


def campaign(seeds: list[int], folder: Path, deadline: float | None = None, verbose: bool = True,
             results: list[Outcome] | None = None, extended: bool = True) -> list[Outcome]:
    """Check each seed until `deadline`, appending to `results` (so a caller stopped midway still
    has the programs checked so far)."""
    results = [] if results is None else results
    for seed in seeds:
        if deadline is not None and time.time() > deadline:
            break
        out = check(seed, folder, extended=extended)
        results.append(out)
        if verbose and out.kind == "bug":
            print(f"--- BUG seed {seed} ({out.host}): {out.detail}\n{program(seed, extended)}", flush=True)
    return results


def bug_kind(outcome: Outcome) -> str:
    """"mismatch" for a wrong answer, else the name of the exception that escaped: a smaller
    program counts as showing the same bug only with the same kind."""
    if outcome.detail.startswith(("input ", "jm.")):
        return "mismatch"
    found = re.findall(r"\b(\w+(?:Error|Exception))\b", outcome.detail)
    return found[-1] if found else outcome.detail.split(":", 1)[0]


def minimise_seed(seed: int, folder: Path, extended: bool = True, max_checks: int = 400,
                  source: str | None = None) -> tuple[Outcome, Minimised | None]:
    """The seed's outcome and, for a bug, its program shrunk to the statements that still show
    the same kind of bug on the inputs it failed on (fuzz_minimise.py)."""
    first = check(seed, folder, source=source, extended=extended)
    if first.kind != "bug":
        return first, None
    failed = re.match(r"(?:jm\.\w+, )?input (\d+)", first.detail)
    only = (0, int(failed.group(1))) if failed else None  # the conversion takes input 0 either way
    kind = bug_kind(first)
    # candidates go to a folder of their own: the seed's file in `folder` keeps its program
    trials = folder / "minimising"
    trials.mkdir(exist_ok=True)

    def fails(src: str) -> bool:
        try:
            with _time_bound(CANDIDATE_SECONDS):
                out = check(seed, trials, source=src, only=only, extended=extended)
        except _OutOfTime:  # a cut that leaves a loop without its exit runs forever: not the bug
            return False
        return out.kind == "bug" and bug_kind(out) == kind
    return first, minimise(source if source is not None else program(seed, extended), fails, max_checks)


CANDIDATE_SECONDS = 120  # one candidate's check (a conversion and every input) takes seconds


class _OutOfTime(BaseException):
    """A candidate ran past its time (a BaseException: `check`'s own handlers let it through)."""


@contextlib.contextmanager
def _time_bound(seconds: float):
    """Raise _OutOfTime in the block once `seconds` have passed (main thread; the Python between
    torch's and JAX's calls sees the signal)."""
    def expired(_signum: int, _frame: Any) -> None:
        raise _OutOfTime

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def summary(results: list[Outcome]) -> str:
    kinds = {k: sum(r.kind == k for r in results) for k in ("match", "refused", "invalid", "numeric", "bug")}
    hosts = {h: sum(r.host == h for r in results if r.kind == "match") for h in ("staged", "dispatch")}
    paths = sum(len(r.paths) for r in results)
    lines = [f"{len(results)} programs: {kinds['match']} match (staged {hosts['staged']}, dispatch "
             f"{hosts['dispatch']}), {kinds['refused']} refused with a located error, {kinds['invalid']} "
             f"invalid (torch fails), {kinds['numeric']} rounding-sensitive (a decision or tie on a float "
             f"threshold), {kinds['bug']} bugs",
             f"paths covered: {paths} distinct decision traces over the matching programs' inputs"]
    for feat in ("float16", "alias", "inplace", "submodule", "view", "list alias", "dict", "shapes", "rebinds",
                 "attributes"):
        with_it = [r for r in results if feat in r.features]
        lines.append(f"  with {feat}: {len(with_it)} programs, {sum(r.kind == 'match' for r in with_it)} match, "
                     f"{sum(r.kind == 'refused' for r in with_it)} refused, {sum(r.kind == 'bug' for r in with_it)} bugs")
    reasons = Counter(r.detail.split(":", 1)[0] for r in results if r.kind == "refused")
    if reasons:
        lines.append("refusals: " + ", ".join(f"{n} {why}" for why, n in reasons.most_common()))
        for why, _ in reasons.most_common():  # which programs, to look at one with --show
            seeds = [r.seed for r in results if r.kind == "refused" and r.detail.split(":", 1)[0] == why]
            lines.append(f"  {why}: seeds {seeds[:6]}{' ...' if len(seeds) > 6 else ''}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0:50", help="a:b, the seed range")
    ap.add_argument("--minutes", type=float, default=None, help="run from a random start until this much time passed")
    ap.add_argument("--show", type=int, default=None, help="print the program of one seed")
    ap.add_argument("--plain", action="store_true", help="without views, list aliases and dict outputs")
    ap.add_argument("--dir", default=None, help="where the generated module files go (default: a temp dir)")
    ap.add_argument("--minimise", type=int, default=None, metavar="SEED",
                    help="shrink one seed's failing program and write it to --dir")
    ap.add_argument("--minimise-bugs", action="store_true", help="in a campaign, shrink each bug found")
    args = ap.parse_args()
    if args.show is not None:
        print(program(args.show, not args.plain))
        return
    import tempfile
    folder = Path(args.dir or tempfile.mkdtemp(prefix="dycl_fuzz_"))
    folder.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    results: list[Outcome] = []

    def stopped(signum: int, _frame: Any) -> None:  # `timeout` ended a program midway: count the rest
        print(f"stopped by signal {signum} while checking a program; the programs checked before it:")
        print(summary(results), flush=True)
        sys.exit(1)

    signal.signal(signal.SIGTERM, stopped)
    if args.minimise is not None:
        _print_minimised(args.minimise, folder, not args.plain)
        return
    if args.minutes is not None:
        start = random.randrange(10**6, 10**9)
        campaign(list(range(start, start + 10**6)), folder, time.time() + 60 * args.minutes, results=results,
                 extended=not args.plain)
    else:
        a, b = (int(v) for v in args.seeds.split(":"))
        campaign(list(range(a, b)), folder, results=results, extended=not args.plain)
    print(summary(results))
    bugs = [r.seed for r in results if r.kind == "bug"]
    if bugs:
        print("bug seeds:", bugs)
        for seed in bugs if args.minimise_bugs else ():
            _print_minimised(seed, folder, not args.plain)
        sys.exit(1)


def _print_minimised(seed: int, folder: Path, extended: bool) -> None:
    first, small = minimise_seed(seed, folder, extended)
    if small is None:
        print(f"seed {seed}: {first.kind}, nothing to minimise")
        return
    path = folder / f"minimised_{seed}.py"
    path.write_text(f"# scripts/fuzz.py seed {seed} ({first.host}): {first.detail.splitlines()[-1]}\n{small.source}\n")
    print(f"seed {seed}: {bug_kind(first)}, forward statements {small.statements[0]} -> {small.statements[1]} "
          f"({small.checks} checks{'' if small.complete else ', stopped early'}); written to {path}\n{small.source}")


if __name__ == "__main__":
    main()
