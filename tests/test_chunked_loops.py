"""Loops the dispatch host runs a chunk of iterations per program (host/chunks.py): a decode loop
whose sequence grows cannot be one staged `while_loop`, and as a host loop it costs a program and
a host read per iteration. Every test compares with the original torch model (tokens, lengths and
decisions exactly, floats within the differential tolerance) over inputs that take every path,
including loops of several chunks, of none, and loops whose speculative iterations would fail."""
from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dycl_jax
from differential import assert_same
from dycl_jax.host import chunks, dispatch
from dycl_jax.rewrite.api import run_dispatch_trace


class _Counted:
    """Counts the dispatch host's region calls and host decisions (loop tests read per iteration)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.regions = self.decisions = 0
        region, truth = dispatch.DispatchHost.run_region, dispatch.DispatchHost.truth

        def counted_region(host, *args):
            self.regions += 1
            return region(host, *args)

        def counted_truth(value):
            self.decisions += 1
            return truth(value)

        monkeypatch.setattr(dispatch.DispatchHost, "run_region", counted_region)
        monkeypatch.setattr(dispatch.DispatchHost, "truth", staticmethod(counted_truth))


class GreedyDecoder(nn.Module):
    """A GRU decoder that `torch.cat`s each token and stops at <end> or `max_len`: up to four chunks."""

    def __init__(self, vocab: int = 12, hidden: int = 16, max_len: int = 13, end: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.cell = nn.GRUCell(hidden, hidden)
        self.out = nn.Linear(hidden, vocab)
        self.bias = nn.Linear(hidden, 1)
        self.max_len, self.end = max_len, end

    def forward(self, h):
        tokens = torch.zeros(1, 1, dtype=torch.long)
        stop_bias = self.bias(h)
        while True:
            h = self.cell(self.embed(tokens[:, -1]), h)
            logits = self.out(h)
            logits[:, self.end] += stop_bias[:, 0]
            word = logits.argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, word], dim=1)
            if word.item() == self.end or tokens.size(1) > self.max_len:
                break
        return tokens, h


class Shrink(nn.Module):
    """`while h.norm() > limit:` with a tensor test: no iteration for some inputs, several for others."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, h):
        steps = 0
        outs = []
        while h.norm() > 1.0:
            h = h * 0.8 + 0.01 * torch.tanh(self.fc(h))
            outs.append(h.sum())
            steps += 1
        return h, steps, outs


class BlockWalk(nn.Module):
    """Early exit written as a `while` indexing a ModuleList by a Python counter: a chunk's
    speculative iterations past the last block cannot be traced, so its host loop runs."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(6, 6) for _ in range(5)])
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        i = 0
        conf = torch.zeros(())
        while conf < 0.55 and i < len(self.blocks):
            x = torch.relu(self.blocks[i](x)) + x
            conf = torch.softmax(self.head(x), -1).max()
            i += 1
        return self.head(x), i


class SavedList(nn.Module):
    """A list held under a second name before the loop: the loop's appends reach both names.
    (`saved is history` in a compiled region is evaluated on copies: not asserted here.)"""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, h):
        history = []
        saved = history
        while h.abs().max() > 0.3:
            h = self.fc(h) * 0.5
            history.append(h)
        return h, len(saved), len(history)


def _twice(model: nn.Module, jm, cases: list[tuple]):
    """(input index, torch's result, the converted model's) for every input, twice round: the first
    time a new path runs the host loop, the second time the chunks' programs serve it."""
    for _ in range(2):
        for k, case in enumerate(cases):
            yield k, model(*case), jm(*case)


def _gru_inputs(n: int) -> list[tuple]:
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(1, 16, generator=g) * 2.0,) for _ in range(n)]


def test_the_captioning_decoder_runs_its_loop_in_chunks(monkeypatch):
    name = "captioning"
    mod = importlib.import_module(f"examples.dynn.{name}")
    model, args = mod.example()
    jm = dycl_jax.to_jax(model, args, host="dispatch")
    cases = mod.inputs(60, seed=1)
    paths = set()
    with torch.no_grad():
        for k, case in enumerate(cases):
            assert_same(model(*case), jm(*case), f"{name} input {k}")
            paths.add(mod.path_of(model, case))
    assert len(paths) >= 5, paths
    host = jm._fn
    loops = [st for st in host.regions.values() if st.spec.label.startswith("island@") and st.parts[0].cache
             and st.spec.outs == (chunks.OUT,)]
    assert loops and all(st.parts[0].host_reason is None for st in loops), "no loop ran in chunks"
    compilations, counted = jm.report().compilations, _Counted(monkeypatch)
    with torch.no_grad():
        for k, case in enumerate(cases):  # every path seen: chunks only, nothing compiled
            assert_same(model(*case), jm(*case), f"{name} input {k}, again")
    assert counted.decisions == 0, f"{counted.decisions} host decisions: the host loop ran"
    assert jm.report().compilations == compilations


def test_a_loop_of_several_chunks_and_its_cache(monkeypatch):
    torch.manual_seed(0)
    model = GreedyDecoder().eval()
    cases = _gru_inputs(50)
    jm = dycl_jax.to_jax(model, cases[0], host="dispatch")
    lengths = set()
    with torch.no_grad():
        for k, case in enumerate(cases):
            want = model(*case)
            assert_same(want, jm(*case), f"input {k}")
            lengths.add(want[0].shape[1])
    assert len(lengths) >= 5 and max(lengths) > 3 * chunks.STEPS, lengths  # loops of one to four chunks
    compilations, counted = jm.report().compilations, _Counted(monkeypatch)
    with torch.no_grad():
        for case in cases:
            jm(*case)
    assert counted.decisions == 0 and jm.report().compilations == compilations


def test_a_loop_with_no_iteration_and_python_values_beside_it():
    torch.manual_seed(0)
    model = Shrink().eval()
    g = torch.Generator().manual_seed(2)
    cases = [(torch.randn(1, 6, generator=g) * s,) for s in (0.1, 0.2, 1.5, 3.0, 0.3, 2.0, 8.0, 20.0) * 6]
    jm = dycl_jax.to_jax(model, cases[2], host="dispatch")
    steps = set()
    with torch.no_grad():
        for k, want, got in _twice(model, jm, cases):
            assert_same(want, got, f"input {k}")
            assert type(got[1]) is int and got[1] == want[1]
            steps.add(want[1])
    assert 0 in steps and max(steps) > chunks.STEPS, steps


def test_speculative_iterations_past_the_last_block_fall_back_to_the_host_loop():
    torch.manual_seed(1)
    model = BlockWalk().eval()
    g = torch.Generator().manual_seed(3)
    cases = [(torch.randn(1, 6, generator=g) * 2,) for _ in range(50)]
    jm = dycl_jax.to_jax(model, cases[0], host="dispatch")
    depths = set()
    with torch.no_grad():
        for k, want, got in _twice(model, jm, cases):
            assert_same(want, got, f"input {k}")
            depths.add(want[1])
    assert len(depths) >= 3, depths


def test_the_loops_appends_reach_every_name_of_the_list():
    torch.manual_seed(0)
    model = SavedList().eval()
    g = torch.Generator().manual_seed(4)
    cases = [(torch.randn(1, 4, generator=g) * s,) for s in (0.2, 1.0, 4.0, 9.0) * 6]
    jm = dycl_jax.to_jax(model, cases[1], host="dispatch")
    with torch.no_grad():
        for k, want, got in _twice(model, jm, cases):
            assert_same(want[0], got[0], f"input {k}")
            assert (got[1], got[2]) == (want[1], want[2]), f"input {k}: {got[1:]} vs {want[1:]}"


def test_a_traced_call_records_each_iteration_as_torch_does():
    """`jm.trace` runs the host loop (chunks would hide the per-iteration decisions)."""
    mod = importlib.import_module("examples.dynn.captioning")
    model, args = mod.example()
    jm = dycl_jax.to_jax(model, args, host="dispatch")
    for k, case in enumerate(mod.inputs(12, seed=2) * 2):
        jm(*case)  # (the second time round: chunks compiled and used)
        got = jm.trace(*case)[1]
        want = run_dispatch_trace(model, "forward", case, jm._fn.failed_islands())[1]
        assert [tuple(d)[:2] for d in got] == [tuple(d)[:2] for d in want], f"input {k}"
        assert len(got) >= 1


def test_decode_loop_with_tokens_read_as_python_ints():
    """`tokens.append(word.item())` in the loop: the tokens stay Python ints, as in torch."""

    class ItemDecoder(GreedyDecoder):
        def forward(self, h):
            tokens = [0]
            word = torch.zeros(1, dtype=torch.long)
            while True:
                h = self.cell(self.embed(word), h)
                word = self.out(h).argmax(-1)
                tokens.append(word.item())
                if tokens[-1] == self.end or len(tokens) > self.max_len:
                    break
            return h, tokens

    torch.manual_seed(0)
    model = ItemDecoder().eval()
    cases = _gru_inputs(30)
    jm = dycl_jax.to_jax(model, cases[0], host="dispatch")
    with torch.no_grad():
        for k, want, got in _twice(model, jm, cases):
            assert_same(want[0], got[0], f"input {k}")
            assert [type(t) for t in got[1]] == [int] * len(want[1]) and got[1] == want[1], f"input {k}"
            assert np.all(np.isfinite(np.asarray(got[0])))
