"""Exported artifacts (`jm.export` / `dycl_jax.load`) run where torch cannot be imported, give the
ORIGINAL torch model's outputs and `jm.trace`'s decisions on every path, at any batch size where
the signature allows it; dispatch-host models round-trip too (host program + region programs), and
what an exported host cannot run without torch is refused at export with a located error."""
from __future__ import annotations

import collections
import contextlib
import functools
import json
import math
import os
import subprocess
import sys
import types
import warnings
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn as nn

import dycl_jax
from dycl_jax.host import dispatch
from dycl_jax.errors import CallError, DecodeBoundError, DyclError, ExportCoverageWarning
from dycl_jax.rewrite.api import run_dispatch_trace, run_torch_trace
from examples.dynn import load
import converted  # tests/: the example conversions this process made already
import torch_free  # tests/: a subprocess where torch cannot be imported
from differential import assert_same  # pytest puts tests/ on sys.path
from test_staged_decode import Unbounded  # a decode loop with only a tensor exit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Loads every artifact and runs every input where `import torch` raises (tests/torch_free.py),
# after `import dycl_jax` first, exactly as a serving image without torch would.
RUNNER = """
import numpy as np
import dycl_jax
for name, (path, inputs) in jobs.items():
    model = dycl_jax.load(path)
    runs = []
    for args in inputs:
        try:
            plain = model(*args)
            traced, decisions = model.trace(*args)
        except dycl_jax.DyclError as err:
            runs.append(("error", type(err).__name__, str(err), getattr(err.location, "file", None)))
            continue
        as_np = lambda t: type(t)(map(np.asarray, t)) if isinstance(t, (list, tuple)) else np.asarray(t)
        runs.append(("ok", as_np(plain), as_np(traced), [tuple(d) + (d.margin,) for d in decisions]))
    out[name] = runs
"""


def _one_per_path(mod, model, n: int) -> list[tuple]:
    """The first input of `mod.inputs(n)` on each path torch takes: every path, cheaply."""
    chosen: dict = {}
    for args in mod.inputs(n):
        chosen.setdefault(mod.path_of(model, args), args)
    assert {p for path in chosen for p in path} >= set(mod.PATHS), "an input set that misses a path"
    return list(chosen.values())


def _numpy(args: tuple) -> tuple:
    return tuple(a.numpy() if isinstance(a, torch.Tensor) else a for a in args)


WARNED: dict[str, list] = {}  # per case: the ExportCoverageWarnings its export gave (filled by `artifacts`)


def _staged_cases() -> dict:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).eval()
    cases = {"mlp": (mlp, dycl_jax.to_jax(mlp, torch.randn(4, 8)),
                     [(torch.randn(3, 8),), (torch.randn(7, 8),)])}
    for name in ("shallow_deep", "act"):
        mod = load(name)
        model, jm = converted.default(name)
        cases[name] = (model, jm, _one_per_path(mod, model, 50))
    decode = Unbounded().eval()
    x = torch.full((1, 2), 0.1)
    cases["decode"] = (decode, dycl_jax.to_jax(decode, (x, torch.tensor(3.0)), host="staged", max_len=3),
                       [(x, torch.tensor(float(limit))) for limit in (0.0, 1.5, 2.5, 8.0)])
    return cases


def _dispatch_case(name: str) -> tuple:
    """An early exit with a numpy fallback, branches of different shapes, a growing decode loop or
    MoE, converted here (not shared: the artifact holds what this jm compiled before export).
    "moe_exact": MoE with no budget for the dense form of its row selections, so that the host
    runs each expert on its own rows (what it does for experts too large to run on every token)."""
    mod = load(name.removesuffix("_exact"))
    model, args = mod.example()
    exact = mock.patch.object(dispatch, "dense_rows_budget", lambda: 0.0)
    with exact if name.endswith("_exact") else contextlib.nullcontext():
        # (all four stage by default, MoE through its bounded form and the others as one padded
        # program or a tensor argmax: their dispatch-host artifact is asked for)
        jm = dycl_jax.to_jax(model, args, host="dispatch")
        # (captioning: two output lengths before export; the others, max length included, held out)
        chosen = mod.inputs(2) if name == "captioning" else _one_per_path(mod, model, 50)
        for a in chosen:  # the host compiles each region signature these inputs reach
            jm(*a)
    return model, jm, chosen + held_out(name)


def _step_decode_case() -> tuple:
    """A greedy decode whose Python step counter reaches the loop body: run at two lengths only."""
    torch.manual_seed(1)
    step_decoder = StepDecoder().eval()
    g = torch.Generator().manual_seed(1)
    by_length: dict = {}
    for _ in range(60):
        x = torch.randn(1, 4, generator=g) * 2
        by_length.setdefault(step_decoder(x)[2], (x,))
    jm = dycl_jax.to_jax(step_decoder, by_length[3])
    jm(*by_length[4])
    return step_decoder, jm, [by_length[n] for n in sorted(by_length)]


# The artifacts in groups that are built, exported and run apart, each on first use: a test waits
# only for its own group, and the xdist workers build different groups at once (the dispatch
# cases take most of the time, MoE and captioning the most of them).
GROUPS = {
    "staged": _staged_cases,
    "small dispatch": lambda: {"numpy_fallback": _dispatch_case("numpy_fallback"),
                               "shape_branch": _dispatch_case("shape_branch"), "step_decode": _step_decode_case()},
    "captioning": lambda: {"captioning": _dispatch_case("captioning")},
    "moe": lambda: {"moe": _dispatch_case("moe")},
    "moe exact": lambda: {"moe_exact": _dispatch_case("moe_exact")},
}
GROUP_OF = {"mlp": "staged", "shallow_deep": "staged", "act": "staged", "decode": "staged",
            "numpy_fallback": "small dispatch", "shape_branch": "small dispatch", "step_decode": "small dispatch",
            "captioning": "captioning", "moe": "moe", "moe_exact": "moe exact"}


def _export_and_run(cases: dict, root, group: str) -> tuple[dict, dict]:
    """Each case's manifest, and what the torch-free runner returned for all of them."""
    jobs, manifests, warned = {}, {}, {}
    for name, (model, jm, inputs) in cases.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ExportCoverageWarning)
            manifests[name] = jm.export(str(root / name))
        warned[name] = [w.message for w in caught if w.category is ExportCoverageWarning]
        jobs[name] = (str(root / name), [_numpy(a) for a in inputs])
    folder = root / f"runner_{group.replace(' ', '_')}"  # beside the artifacts, named apart from them
    folder.mkdir()
    results = torch_free.run(folder, RUNNER, jobs)
    WARNED.update(warned)
    return manifests, results


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """`artifacts(*names)`: (cases, manifests, results, root) with at least the named cases, each
    case (torch model, jm, inputs), its manifest and what the torch-free runner returned;
    results["torch loaded"]: the torch modules any of the runs so far had loaded."""
    root = tmp_path_factory.mktemp("artifacts")
    cases, manifests, results = {}, {}, {"torch loaded": []}

    def get(*names: str) -> tuple:
        for group in dict.fromkeys(GROUP_OF[n] for n in names):
            if group in built:
                continue
            built.add(group)
            made = GROUPS[group]()
            more, ran = _export_and_run(made, root, group)
            cases.update(made)
            manifests.update(more)
            results["torch loaded"] += ran.pop("torch loaded")
            results.update(ran)
        return cases, manifests, results, root

    built: set[str] = set()
    return get


def _same_decisions(want: list, got: list, label: str) -> None:
    assert [tuple(d) for d in want] == [(s, v) for s, v, _ in got], f"{label}: decisions differ"
    for d, (_, _, m) in zip(want, got):  # the same margins: the traced program computes them alike
        assert (math.isnan(d.margin) and math.isnan(m)) or abs(d.margin - m) <= 1e-6, f"{label}: {d} vs {m}"


def test_import_and_load_need_no_torch(artifacts) -> None:
    _, _, results, _ = artifacts("mlp")  # (the dispatch groups' runs: checked by their round-trip tests)
    assert results["torch loaded"] == []
    # with torch importable, `import dycl_jax` still leaves it alone (no optional import either)
    code = "import sys, dycl_jax; dycl_jax.DyclError; print(sorted(m for m in sys.modules if m.startswith('torch')))"
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]


@pytest.mark.parametrize("name", ["mlp", "shallow_deep", "act"])
def test_round_trip_matches_torch_and_jm_on_every_path(artifacts, name) -> None:
    cases, manifests, results, _ = artifacts(name)
    model, jm, inputs = cases[name]
    assert len(results[name]) == len(inputs)
    for k, (args, run) in enumerate(zip(inputs, results[name])):
        assert run[0] != "error", run
        _, plain, traced, decisions = run
        with torch.no_grad():
            want = model(*args)
        # floats within differential.RTOL/ATOL (1e-4) of torch; exit ids, step counts and flags exactly
        assert_same(want, plain, f"{name} input {k} (loaded vs torch)")
        assert_same(want, traced, f"{name} input {k} (loaded trace vs torch)")
        jm_out, jm_decisions = jm.trace(*args)
        for a, b in zip(jax_leaves(jm_out), jax_leaves(plain)):
            np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-6, err_msg=f"{name} input {k} vs jm")
        _same_decisions(jm_decisions, decisions, f"{name} input {k}")
    if name != "mlp":
        assert any(run[3] for run in results[name]), "no decision was reported"
    man = manifests[name]
    assert man["host"] == "staged" and "cpu" in man["platforms"]
    assert man["source"]["class"].endswith(type(model).__name__) and man["versions"]["torch"] == torch.__version__


DISPATCH_CASES = ("numpy_fallback", "shape_branch", "captioning", "moe", "moe_exact")


@functools.lru_cache(maxsize=None)
def held_out(name: str) -> list[tuple]:
    """Inputs never run before export: MoE's expert regions take any number of tokens (symbolic
    sizes); captioning's decode loop takes any step and its `alphas` list any length: every
    other caption length, the cutoff at max_len included."""
    if name == "captioning":
        mod = load(name)
        model, _ = mod.example()
        seen = {mod.path_of(model, a) for a in mod.inputs(2)}
        return [a for a in _one_per_path(mod, model, 50) if mod.path_of(model, a) not in seen]
    return load("moe").inputs(4, seed=7) if name.startswith("moe") else []


@pytest.mark.parametrize("name", DISPATCH_CASES)
def test_dispatch_round_trip_matches_torch_and_jm_trace(artifacts, name) -> None:
    cases, manifests, results, root = artifacts(name)
    assert results["torch loaded"] == []  # the loaded host programs and regions imported no torch
    model, jm, inputs = cases[name]
    assert jm.host == "dispatch" and manifests[name]["format"] == "dycl_jax.hosted/2"
    n_run = len(inputs) - len(held_out(name))
    for k, (args, run) in enumerate(zip(inputs, results[name])):
        assert run[0] == "ok", run
        _, plain, traced, decisions = run
        with torch.no_grad():
            want = model(*args)
        assert_same(want, plain, f"{name} input {k} (loaded dispatch host vs torch)")
        assert_same(want, traced, f"{name} input {k} (loaded trace vs torch)")
        if k < n_run:  # (jm would compile the held-out signatures first)
            _same_decisions(jm.trace(*args)[1], decisions, f"{name} input {k}")
        elif name != "moe_exact":  # the decisions of the dispatch rewrite run in torch (it has no margins)
            want = run_dispatch_trace(model, "forward", args, jm._fn.failed_islands())[1]
            assert [tuple(d) for d in want] == [(s, v) for s, v, _ in decisions], f"{name} input {k}"
        else:  # exact routing makes no data-dependent decision: none is reported for a held-out input either
            assert decisions == [], decisions
    # (MoE's `if sel.numel() == 0` is a staged cond in its dense form, a Python bool in its exact one)
    assert any(run[3] for run in results[name]) == (name != "moe_exact"), "decisions reported (or not)"
    host = (root / name / "host.py").read_text()
    assert "torch" not in host.replace("torch-free", "") and "rt.region(" in host
    if name == "moe_exact":  # one program per expert for every token count, and the sub-host called from the host program
        parts = [p for r in manifests[name]["regions"] for p in r.get("parts", ())]
        assert any("ranges" in e for p in parts for e in p["entries"]) and "self.moe(" in host


def jax_leaves(tree) -> list:
    return list(tree) if isinstance(tree, (list, tuple)) else [tree]


def test_one_artifact_takes_every_batch_size(artifacts) -> None:
    cases, manifests, results, root = artifacts("mlp", "shallow_deep")
    man = manifests["mlp"]
    assert man["batch"]["dim0"] == "symbolic" and man["inputs"][0]["shape"] == ["b0", 8]
    assert set(man["platforms"]) == {"cpu", "cuda"}
    sizes = [run[1].shape[0] for run in results["mlp"]]
    assert sizes == [3, 7]
    # the early-exit example was converted at batch 1, which torch specialises: said, and enforced
    sd = manifests["shallow_deep"]
    assert sd["batch"]["dim0"] == "fixed" and sd["inputs"][0]["shape"][0] == 1
    with pytest.raises(CallError, match="expected float32"):
        dycl_jax.load(str(root / "shallow_deep"))(np.zeros((2, 3, 16, 16), np.float32))
    assert {tuple(s) for s in sd["trace"]["sites"]} <= {(s, "bool") for s in sd["decision_sites"]}


def test_decode_artifact_trims_and_raises_beyond_max_len(artifacts) -> None:
    cases, manifests, results, _ = artifacts("decode")
    model, jm, inputs = cases["decode"]
    lengths = set()
    for k, (args, run) in enumerate(zip(inputs, results["decode"])):
        with torch.no_grad():
            want = model(*args)
        if want.shape[0] - 1 > 3:  # beyond max_len: the located error, as jm(...) raises it
            with pytest.raises(DecodeBoundError) as info:
                jm(*args)
            assert run[:2] == ("error", "DecodeBoundError") and str(info.value) == run[2]
            assert run[3].endswith("test_staged_decode.py")
            continue
        assert_same(want, run[1], f"decode input {k}")
        _same_decisions(jm.trace(*args)[1], run[3], f"decode input {k}")
        lengths.add(want.shape[0])
    assert len(lengths) >= 2 and any(r[0] == "error" for r in results["decode"]), lengths


class PositiveRows(nn.Module):
    def forward(self, x):
        # a host statement (the sum too; a read only as `torch.nonzero(...)` alone): no torch-free form
        rows = torch.nonzero(x.sum(1) > 0).flatten()
        if rows.numel() == 0:
            return x.sum()
        return x[rows].sum()


class PositiveRowsRead(nn.Module):
    def forward(self, x):
        rows = (x.sum(1) > 0).nonzero()  # a read (host/reads.py): the sum compiled, the nonzero numpy
        if rows.numel() == 0:
            return x.sum()
        return x[rows[:, 0]].sum()


def test_dispatch_host_statement_without_torch_free_form_is_refused_at_export(tmp_path) -> None:
    jm = dycl_jax.to_jax(PositiveRows(), torch.randn(3, 2))
    assert jm.host == "dispatch"
    with pytest.raises(DyclError) as info:
        jm.export(str(tmp_path / "a"))
    err = info.value
    assert err.location is not None and err.location.file.endswith("test_artifact.py")
    assert "rows = torch.nonzero(x.sum(1) > 0).flatten()" in str(err) and "nonzero" in str(err)
    assert not os.path.exists(tmp_path / "a" / "manifest.json")


def test_a_nonzero_read_exports_and_runs_without_torch(tmp_path) -> None:
    g = torch.Generator().manual_seed(5)
    inputs = [torch.randn(3, 2, generator=g) for _ in range(8)] + [-torch.ones(3, 2), torch.ones(3, 2)]
    model = PositiveRowsRead()
    jm = dycl_jax.to_jax(model, (inputs[0],))
    assert jm.host == "dispatch"
    for x in inputs:  # the signatures an exported host serves are those the host has run
        jm(x)
    jm.export(str(tmp_path / "a"))
    body = ("import numpy as np, dycl_jax\nm = dycl_jax.load(jobs['path'])\n"
            "out['got'] = [float(np.asarray(m(x))) for x in jobs['inputs']]\n")
    results = torch_free.run(tmp_path, body, {"path": str(tmp_path / "a"), "inputs": [x.numpy() for x in inputs]})
    assert results["torch loaded"] == []
    want = [float(model(x)) for x in inputs]
    np.testing.assert_allclose(results["got"], want, rtol=1e-5, atol=1e-6)
    assert want[-2] == -6.0 and want[-1] == 6.0  # no row selected, every row selected


def test_load_refuses_a_directory_without_manifest(tmp_path) -> None:
    with pytest.raises(DyclError, match="manifest.json"):
        dycl_jax.load(str(tmp_path))
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "other/9"}))
    with pytest.raises(DyclError, match="format"):
        dycl_jax.load(str(tmp_path))


Scored = collections.namedtuple("Scored", "logits score")


class DictInDictOut(nn.Module):
    """Research-style signature: a dict batch, a threshold baked in, a namedtuple, a list and a
    Python number out; `x + y` ties the two batch dimensions to one symbol; a loop whose number
    of tests depends on the input (for the trace's capacity)."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 3)

    def forward(self, batch, thr):
        h = self.l(batch["x"]) * 2
        if h.mean() > thr:
            h = h + batch["y"]
        while h.abs().max() > 4:
            h = h * 0.5
        return {"out": Scored(h, h.sum()), "list": [h.max(), 3], "n": 7}


def test_structured_signature_round_trip_and_call_errors(tmp_path) -> None:
    torch.manual_seed(0)
    model = DictInDictOut().eval()
    jm = dycl_jax.to_jax(model, ({"x": torch.randn(5, 4), "y": torch.randn(5, 3)}, 0.1))
    capacity = 4
    man = jm.export(str(tmp_path / "a"), trace_capacity=capacity)
    assert man["batch"] == {"dim0": "symbolic", "symbols": {"0": "b", "1": "b"}}
    loaded = dycl_jax.load(str(tmp_path / "a"))
    g = torch.Generator().manual_seed(3)
    branches, overflowed = set(), False
    for n, shift, scale in ((9, -5.0, 1.0), (2, 5.0, 1.0), (3, 0.0, 40.0)):  # other batch sizes, both branches
        batch = {"x": (torch.randn(n, 4, generator=g) + shift) * scale, "y": torch.randn(n, 3, generator=g)}
        args = ({k: v.numpy() for k, v in batch.items()}, 0.1)
        with torch.no_grad():
            want = model(batch, 0.1)
        torch_decisions = run_torch_trace(model, "forward", (batch, 0.1))[1]
        if len(torch_decisions) > capacity:  # more decisions than the log holds: said, with the fix
            with pytest.raises(DyclError, match=f"made {len(torch_decisions)} decisions.*at most {capacity}") as info:
                loaded.trace(*args)
            assert f"trace_capacity={2 * len(torch_decisions)}" in info.value.fix
            overflowed = True
            got = loaded(*args)
        else:
            got, decisions = loaded.trace(*args)
            assert decisions == torch_decisions
            branches.add(decisions[0][1])
        # a namedtuple comes back as one of its name and fields (the loader imports no user code)
        assert type(got["out"]).__name__ == "Scored" and got["out"]._fields == Scored._fields
        assert isinstance(got["list"], list)
        assert_same(want, {**got, "out": Scored(*got["out"])}, f"batch {n}")
    assert branches == {True, False} and overflowed
    x, y = np.zeros((4, 4), np.float32), np.zeros((4, 3), np.float32)
    for bad, message in [(({"x": x, "y": y}, 0.2), "baked in as 0.1"), (({"x": x}, 0.1), "expected keys"),
                         (({"x": x, "y": y[:3]}, 0.1), r"expected float32\[b, 3\]"),
                         (({"x": x.astype(np.float16), "y": y}, 0.1), "expected float32")]:
        with pytest.raises(CallError, match=message):
            loaded(*bad)


END, MAX_STEPS = 0, 10


class StepDecoder(nn.Module):
    """Greedy decode into a preallocated buffer: a Python step counter indexes the position
    table and the buffer and shifts the end score (`.item()` ends it), so the loop body takes
    the step as a Python int; the count comes back as a Python int."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.cell = nn.Linear(8, 8)
        self.head = nn.Linear(8, 5)
        self.pos = nn.Parameter(torch.randn(MAX_STEPS, 8) * 0.5)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        tokens = torch.zeros(1, MAX_STEPS, dtype=torch.long)
        step = 0
        while True:
            h = torch.tanh(self.cell(h) + self.pos[step])
            scores = self.head(h)
            scores[:, END] += (step - 3) * 0.8 + x[:, 0]
            word = scores.argmax(-1)
            tokens[:, step] = word
            step += 1
            if word.item() == END or step >= MAX_STEPS:
                break
        return tokens, h, step


def test_decode_artifact_serves_step_counts_never_run_before_export(artifacts) -> None:
    cases, manifests, results, _ = artifacts("step_decode")
    assert results["torch loaded"] == []
    model, jm, inputs = cases["step_decode"]
    lengths = []
    for k, (args, run) in enumerate(zip(inputs, results["step_decode"])):
        assert run[0] == "ok", run
        _, plain, traced, decisions = run
        with torch.no_grad():
            want = model(*args)
        # tokens and the step count exactly, the hidden state within 1e-4, decisions as torch's
        assert_same(want, (plain[0], plain[1], int(plain[2])), f"step_decode input {k} (loaded vs torch)")
        assert_same(want, (traced[0], traced[1], int(traced[2])), f"step_decode input {k} (loaded trace)")
        _same_decisions(jm.trace(*args)[1], decisions, f"step_decode input {k}")
        lengths.append(int(plain[2]))
    assert lengths == list(range(1, MAX_STEPS + 1)), lengths  # only 3 and 4 ran before export
    man = manifests["step_decode"]
    body = [p for r in man["regions"] if "step" in r["ins"] for p in r["parts"]]  # the loop body, the return
    # a part that only moves its values (the return) runs as its statements, on any count
    programs = [p for p in body if "python" not in p]
    assert programs and all(any("ints" in e for e in p["entries"]) for p in programs), "the step is not a scalar input"
    assert man["coverage"]["complete"] and WARNED["step_decode"] == []


class ReadsHistory(nn.Module):
    """A decode loop whose body reads its whole history list each step (`sum(outs)`), and a
    return that indexes it: unlike appending or stacking, neither takes a list of any length."""

    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, x):
        h = x
        outs = [x]
        while True:
            h = torch.tanh(self.cell(h) + 0.1 * sum(outs))
            outs.append(h)
            if h.sum().item() > 1.0 or len(outs) > 6:
                break
        return outs[1], h


class GrowsThenScales(nn.Module):
    """A decode loop growing `ys` (its body one program of symbolic length) and a return region
    that sees `ys` at the length of this call only."""

    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, x):
        ys = x
        for _ in range(5):
            h = torch.tanh(self.cell(ys[:, :4] + ys.mean()))
            ys = torch.cat([ys, h], 1)
            if h.sum().item() > x.sum().item():
                break
        return ys * 2


def test_a_part_run_at_one_size_of_a_growing_variable_is_not_counted_as_covered(tmp_path, monkeypatch) -> None:
    """Run at one decode length, the return region has one program (the body's takes any length):
    the manifest says so, and the loaded artifact does refuse another length."""
    torch.manual_seed(0)
    model = GrowsThenScales().eval()
    g = torch.Generator().manual_seed(1)
    by_length: dict = {}
    for _ in range(200):
        x = torch.randn(1, 4, generator=g)
        by_length.setdefault(model(x).shape[1], x)
    (short, x_short), (long, x_long) = sorted(by_length.items())[:2]
    jm = dycl_jax.to_jax(model, (x_long,), host="dispatch")  # auto would stage it padded
    with pytest.warns(ExportCoverageWarning) as caught:
        man = jm.export(str(tmp_path / "a"))
    line = GrowsThenScales.forward.__code__.co_firstlineno + 7  # `return ys * 2`
    assert not man["coverage"]["complete"] and [u["line"] for u in man["coverage"]["uncovered"]] == [line]
    assert "`ys` took several sizes" in str(caught[0].message)
    loaded = dycl_jax.load(str(tmp_path / "a"))
    np.testing.assert_allclose(np.asarray(loaded(x_long.numpy())), model(x_long).detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(CallError):  # the length not run before export: as the manifest says
        loaded(x_short.numpy())
    # a bug of ours while the body is captured with symbolic sizes surfaces (no per-signature fallback)
    from dycl_jax.runtime import hosted_symbolic
    monkeypatch.setattr(hosted_symbolic, "_capture", _bug_in(hosted_symbolic))
    with pytest.raises(KeyError):
        jm.export(str(tmp_path / "b"))
    assert not os.path.exists(tmp_path / "b")


def _bug_in(module: types.ModuleType):
    """A function raising KeyError from a frame of `module`'s file: a bug of ours, as
    errors.raised_by_us tells one."""
    namespace: dict = {}
    exec(compile("def bug(*args, **kwargs):\n    raise KeyError('a bug of ours')\n", module.__file__, "exec"), namespace)
    return namespace["bug"]


def test_a_bug_of_ours_in_the_symbolic_batch_export_is_raised_not_a_fixed_batch(tmp_path, monkeypatch) -> None:
    from jax import export as jax_export
    from dycl_jax.runtime import artifact
    jm = dycl_jax.to_jax(nn.Linear(3, 2).eval(), torch.randn(4, 3))
    monkeypatch.setattr(artifact, "jax_export", types.SimpleNamespace(export=jax_export.export,
                                                                     symbolic_shape=_bug_in(artifact)))
    with pytest.raises(KeyError):
        jm.export(str(tmp_path / "a"))
    monkeypatch.undo()
    assert jm.export(str(tmp_path / "a"))["batch"]["dim0"] == "symbolic"


def test_export_warns_where_unseen_inputs_are_not_served(artifacts, tmp_path) -> None:
    cases, manifests, _, _ = artifacts("captioning", "shape_branch")
    # captioning's `alphas` list goes into its loop body empty and is stacked at the return: served
    assert manifests["captioning"]["coverage"]["complete"] and WARNED["captioning"] == []
    body = [p for r in manifests["captioning"]["regions"] for p in r.get("parts", ()) if p.get("appends")]
    assert body and all(p["appends"] == ["alphas"] for p in body)
    torch.manual_seed(3)
    model = ReadsHistory().eval()
    jm = dycl_jax.to_jax(model, torch.full((1, 4), 0.5), host="dispatch")  # 2 steps; auto stages it padded
    jm(torch.zeros(1, 4))  # 6 steps: the body's `sum(outs)` takes a list one longer per step
    assert jm.host == "dispatch"
    with pytest.warns(ExportCoverageWarning) as caught:
        man = jm.export(str(tmp_path / "a"))
    lines = {u["line"] for u in man["coverage"]["uncovered"]}
    line = ReadsHistory.forward.__code__.co_firstlineno
    assert line + 4 in lines and not man["coverage"]["complete"], lines  # the body, where `sum(outs)` reads it
    message = str(caught[0].message)
    assert f"test_artifact.py:{min(lines)}:" in message and "before jm.export" in message
    assert WARNED["shape_branch"] == []
    with pytest.raises(DyclError) as info:
        jm.export(str(tmp_path / "strict"), strict=True)
    assert info.value.location.file.endswith("test_artifact.py") and "strict=False" in info.value.fix
    assert not os.path.exists(tmp_path / "strict" / "manifest.json")
