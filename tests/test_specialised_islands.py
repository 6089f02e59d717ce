"""Islands specialised to the values of Python ints they take (host/specialised.py): after a
`.tolist()` read, a teacher-forced decoder's `for t in range(max(steps))` with `h[:bt]` stages as
one program per `steps` list, compiled on the list's second call (its first runs the host
version, regions that serve any values), at most PROGRAMS of them. Results equal the original
torch model on every call; `jm.trace` equals the rewritten torch program replaying the host's
choices; the emitted module and the artifact fall back to the host version for other lists."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import dycl_jax
from differential import assert_same
from dycl_jax.errors import ExportCoverageWarning
from dycl_jax.host import specialised
from dycl_jax.rewrite.api import run_dispatch_trace


class TeacherDecoder(nn.Module):
    """Caption lengths to a Python list, a batch that shrinks at each step, a tensor `if` after."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.rec = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x, lengths):
        steps = (lengths - 1).tolist()
        h = torch.zeros(x.shape[0], 8)
        preds = torch.zeros(x.shape[0], max(steps), 3)
        for t in range(max(steps)):
            bt = sum([s > t for s in steps])
            h = torch.tanh(self.inp(x[:bt, t]) + self.rec(h[:bt]))
            preds[:bt, t] = self.out(h)
        if preds.sum() > 0:
            preds = preds * 0.5
        return preds, steps


def _case(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, 5, 4, generator=g) * 2, torch.tensor(lengths)


LISTS = [[5, 4, 2], [4, 4, 3], [3, 2, 2], [5, 5, 5]]


def _island(jm):
    """The island after the `.tolist()` read (the tail's own islands fail to stage on it)."""
    return next(st for st in jm._fn.regions.values() if st.spec.kind == "island" and st.parts[0].host_reason is None)


def _check(model, jm, args, where):
    with torch.no_grad():
        want = model(*args)
    assert_same(want, jm(*(a.numpy() for a in args)), where)
    got, trace = jm.trace(*(a.numpy() for a in args))
    assert_same(want, got, f"{where} (traced)")
    _, rewritten = run_dispatch_trace(model, "forward", args, jm._fn.failed_islands(), jm._fn.alias_choices)
    assert [(d[0], bool(d[1])) for d in trace] == [(d[0], bool(d[1])) for d in rewritten], where
    return trace


def test_a_list_compiles_on_its_second_call_and_every_call_matches_torch():
    torch.manual_seed(0)
    model = TeacherDecoder().eval()
    jm = dycl_jax.to_jax(model, _case(LISTS[0], 0))
    assert jm.host == "dispatch"
    island = _island(jm).parts[0]
    assert sum(1 for e in island.cache.values() if type(e).__name__ == "Compiled") == 1  # the first list's
    for seed, lengths in enumerate(LISTS[1:], 1):
        before = len(island.cache)
        args = _case(lengths, seed)
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*(a.numpy() for a in args)), f"{lengths} first")
        assert len(island.cache) == before, "compiled on the first sight of its values"
        _check(model, jm, _case(lengths, seed + 10), f"{lengths} second")  # (two calls: jm and jm.trace)
        assert len(island.cache) == before + 1, "not compiled on the second sight"
    decisions = set()
    for seed in range(8):  # now every call runs one program: every input matches, both paths taken
        decisions |= {bool(d[1]) for d in _check(model, jm, _case(LISTS[seed % 4], 100 + seed), f"seed {seed}")}
    assert decisions == {True, False}
    assert island.host_reason is None


def test_an_island_that_reaches_its_program_count_stays_on_the_host(monkeypatch):
    monkeypatch.setattr(specialised, "PROGRAMS", 2)
    torch.manual_seed(0)
    model = TeacherDecoder().eval()
    jm = dycl_jax.to_jax(model, _case(LISTS[0], 0))
    island = _island(jm).parts[0]
    for seed, lengths in enumerate(LISTS * 2):
        _check(model, jm, _case(lengths, seed), f"{lengths} call {seed}")
    assert island.host_reason is not None and "more than 2" in island.host_reason
    assert sum(1 for e in island.cache.values() if type(e).__name__ == "Compiled") == 2
    for seed, lengths in enumerate(LISTS):  # the host version serves every list, exactly
        _check(model, jm, _case(lengths, 50 + seed), f"{lengths} after")


def test_emitted_module_and_artifact_fall_back_to_the_host_version(tmp_path):
    torch.manual_seed(0)
    model = TeacherDecoder().eval()
    compiled, once = _case(LISTS[0], 0), _case(LISTS[1], 1)
    jm = dycl_jax.to_jax(model, compiled)
    jm(*(a.numpy() for a in once))  # the host version runs for this list
    jm.emit(str(tmp_path / "emitted"))
    text = (tmp_path / "emitted" / "model.py").read_text()
    assert "return None  # its host version runs" in text
    import importlib.util
    spec = importlib.util.spec_from_file_location("emitted_teacher", tmp_path / "emitted" / "model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    emitted = mod.load()
    with pytest.warns(ExportCoverageWarning):
        jm.export(str(tmp_path / "artifact"))
    loaded = dycl_jax.load(str(tmp_path / "artifact"))
    # the island's list (another input too), and the list only its host version ran (the paths
    # the emitted module serves are those run before emitting)
    for args in (compiled, once, _case(LISTS[0], 7)):
        with torch.no_grad():
            want = model(*args)
        np_args = [a.numpy() for a in args]
        assert_same(want, emitted(*np_args), "emitted")
        assert_same(want, loaded(*np_args), "artifact")
