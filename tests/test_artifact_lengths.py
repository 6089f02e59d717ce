"""Dispatch artifacts whose decode-loop programs take sizes read from a growing sequence
(`torch.full((n, n), ...)`, `arange(n)`, `new_zeros`) serve decode lengths never run before
export, where torch cannot be imported."""
from __future__ import annotations

import ast
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

import dycl_jax
from dycl_jax.errors import ExportCoverageWarning
from examples.dynn import load
import torch_free  # tests/: a subprocess where torch cannot be imported

# each job: load the artifact and run its inputs with `import torch` failing
RUNNER = """
import importlib.util
import numpy as np
import dycl_jax
def emitted(path):  # the emitted Flax module of a dispatch model (jm.emit), errors kept per input
    spec = importlib.util.spec_from_file_location("emitted_model", path + "/model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.load()
    def call(*a):
        try:
            return model(*a)
        except ValueError as err:
            return ("ValueError", str(err))
    return call
for name, (path, inputs) in jobs.items():
    model = emitted(path) if name.endswith(" emitted") else dycl_jax.load(path)
    out[name] = [r if isinstance(r[0], str) else tuple(np.asarray(v) for v in (r if isinstance(r, tuple) else (r,)))
                 for r in map(lambda a: model(*a), inputs)]
"""


class Positions(nn.Module):
    """A greedy decoder that rebuilds, each step, its positions with `torch.arange(seq.size(1))`,
    a causal mask from `torch.ones(n, n)` and a padding column with `seq.new_zeros`; the exit is
    an `.item()` read, and the step count a Python int it returns."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(8, 6)
        self.pos = nn.Embedding(16, 6)
        self.out = nn.Linear(6, 8)

    def forward(self, seq):
        steps = 0
        while steps < 7:
            n = seq.size(1)
            mask = torch.ones(n, n).triu(1) * -1e4
            h = self.emb(seq) + self.pos(torch.arange(n))
            att = torch.softmax(h @ h.transpose(1, 2) / 3.0 + mask, -1) @ h
            word = self.out(att[:, -1]).argmax(-1, keepdim=True)
            pad = seq.new_zeros(seq.size(0), 1)
            seq = torch.cat([seq, torch.where(word > 0, word, pad)], 1)
            steps += 1
            if word.sum().item() == 0:
                break
        return seq, steps


def _greedy_nmt() -> tuple:
    mod = load("greedy_nmt")
    model, _ = mod.example()
    by_length: dict = {}
    for args in mod.inputs(60):
        by_length.setdefault(model(*args).size(1), args)
    return model, by_length


def _positions() -> tuple:
    torch.manual_seed(5)
    model = Positions().eval()
    g = torch.Generator().manual_seed(2)
    by_length: dict = {}
    for _ in range(80):
        seq = torch.randint(1, 8, (2, 2), generator=g)
        by_length.setdefault(model(seq)[1], (seq,))
    return model, by_length


@pytest.fixture(scope="module")
def lengths(tmp_path_factory):
    """Per case: the torch model, its inputs by decode length, the lengths run before export,
    the manifest, the coverage warnings and what the torch-free runner returned per input."""
    root = tmp_path_factory.mktemp("lengths")
    cases = {}
    with torch.no_grad():
        for name, make in (("greedy_nmt", _greedy_nmt), ("positions", _positions)):
            model, by_length = make()
            known = sorted(by_length)
            # two short decodes only (each step a capture): the loop body meets two sizes of the
            # growing sequence after its first step (which may differ in integer width) and the
            # return two lengths
            ran = [known[0], min(n for n in known if n >= 3)]
            jm = dycl_jax.to_jax(model, by_length[ran[0]], host="dispatch")
            jm(*by_length[ran[1]])
            assert jm.host == "dispatch"
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ExportCoverageWarning)
                manifest = jm.export(str(root / name))
            warned = [str(w.message) for w in caught if w.category is ExportCoverageWarning]
            cases[name] = (model, by_length, ran, manifest, warned)
            if name == "positions":  # its emitted module too, from the signatures the host ran
                jm.emit(str(root / "positions emitted"))
    jobs = {name: (str(root / name), [tuple(a.numpy() for a in by_length[n]) for n in sorted(by_length)])
            for name, (_, by_length, _, _, _) in cases.items()}
    jobs["positions emitted"] = (str(root / "positions emitted"), jobs["positions"][1])
    results = torch_free.run(root, RUNNER, jobs)
    return cases, results


@pytest.mark.parametrize("name", ("greedy_nmt", "positions"))
def test_symbolic_sizes_serve_decode_lengths_never_run_before_export(lengths, name) -> None:
    cases, results = lengths
    assert results["torch loaded"] == []
    model, by_length, ran, manifest, warned = cases[name]
    assert len(by_length) >= 4, sorted(by_length)  # lengths on both sides of the one run
    for n, got in zip(sorted(by_length), results[name]):
        with torch.no_grad():
            want = model(*by_length[n])
        want = want if isinstance(want, tuple) else (want,)
        # tokens (int64) and the step count exactly
        assert len(got) == len(want), (n, got)
        for w, g in zip(want, got):
            w = w.numpy() if isinstance(w, torch.Tensor) else np.asarray(w)
            assert w.shape == g.shape and np.array_equal(w, g), f"{name} length {n}: {w} vs {g}"
    assert manifest["coverage"]["complete"] and warned == [], (manifest["coverage"], warned)
    body = [p for r in manifest["regions"] for p in r.get("parts", ()) if any("ranges" in e for e in p["entries"])]
    assert body, "no program over a symbolic size"


def test_emitted_decoder_serves_the_lengths_it_ran_and_names_them_for_others(lengths) -> None:
    """The emitted module of a decode loop holds one version of a region per size it ran at: each
    length run before emitting (or met as a step of a longer decode) equals torch; a longer one
    is a ValueError listing the sizes it serves, never another answer."""
    cases, results = lengths
    model, by_length, ran, _, _ = cases["positions"]
    served = []
    for n, got in zip(sorted(by_length), results["positions emitted"]):
        if isinstance(got[0], str):
            assert "serves only" in got[1], got[1]
            listed = ast.literal_eval(got[1].split("before it was emitted: ")[1].split("; emit")[0])
            assert listed and all(len(key) == 2 for key in listed), got[1]  # (sizes, values) it holds, named
            continue
        served.append(n)
        with torch.no_grad():
            want = model(*by_length[n])
        assert len(got) == 2 and np.array_equal(want[0].numpy(), got[0]) and int(got[1]) == want[1], (n, got)
    assert set(ran) <= set(served) and max(by_length) not in served, (ran, served)
