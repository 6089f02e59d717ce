"""`host="auto"` stages a method whose values differ in shape between its paths as one padded
program (convert._padded): a decode loop that its own Python bound ends within 16 iterations,
an `if` whose branches return different shapes. Calls return the exact result, compared with
the ORIGINAL torch model on every output length; decisions are the exact ones (only reached
iterations decide); loops that may run longer, or stop on tensors only, go to dispatch."""
from __future__ import annotations

from functools import lru_cache

import jax
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dycl_jax
from dycl_jax.errors import DyclError
from dycl_jax.report.render import render_report
from dycl_jax.rewrite.api import run_torch_trace
from examples.dynn import PADDED_MODELS, load
from differential import assert_same  # pytest puts tests/ on sys.path
from emit_jobs import run_emitted
from test_emit import _cases, compare

N_INPUTS = 50


@lru_cache(maxsize=None)
def _converted(name: str, host: str = "auto"):
    model, args = load(name).example()
    return model, dycl_jax.to_jax(model, args, host=host)


def _decisions(trace) -> list[tuple[str, int]]:
    return [(d.site, int(d.value)) for d in trace]


def _check(model: nn.Module, jm, args: tuple) -> list[tuple[str, int]]:
    """Outputs equal torch's (exact shapes, ints exactly); decisions equal the rewritten torch
    program's on the same padded rewrite. Returns the decisions."""
    with torch.no_grad():
        want = model(*args)
    assert_same(want, jm(*args), "call")
    got, decisions = jm.trace(*args)
    assert_same(want, got, "trace")
    torch_out, torch_decisions = run_torch_trace(model, "forward", args, unroll=jm.unroll)
    assert_same(want, torch_out, "run_torch_trace")
    assert _decisions(decisions) == [(s, int(v)) for s, v in torch_decisions]
    return _decisions(decisions)


@pytest.mark.parametrize("name", PADDED_MODELS)
def test_padded_examples_stage_under_auto_and_match_torch_on_every_path(name: str) -> None:
    mod = load(name)
    model, jm = _converted(name)
    assert jm.host == "staged" and jm.unroll is not None and jm.unroll.natural
    report = jm.report()
    assert f"{name}.py:" in report.padded_reason
    assert "why padded" in render_report(report)
    paths = set()
    for args in mod.inputs(N_INPUTS, seed=11):
        _check(model, jm, args)
        paths.add(mod.path_of(model, args))
    assert len(paths) >= 2, paths  # several output lengths / branches taken


def test_emitted_padded_modules_match_torch_on_every_path(tmp_path) -> None:
    # the emitted module runs the padded program as its jitted `padded` method and cuts each value
    # to its lengths in `__call__`, without torch: exact shapes on every path, as jm(...) gives
    jobs, made = {}, {}
    for name in PADDED_MODELS:
        model, jm = _converted(name)
        jm.emit(str(tmp_path / name))
        cases = _cases(load(name), 8)
        made[name] = (model, jm, cases)
        jobs[name] = (str(tmp_path / name), [tuple(a.numpy() for a in c) for c in cases], "padded")
    results = run_emitted(tmp_path, jobs)
    for name, (model, jm, cases) in made.items():
        status, outs = results[name]
        assert status == "ok", f"{name}: the emitted module failed without torch:\n{outs}"
        # under jax.jit: `padded` gives jm.padded's arrays; the call, which cuts on the host, says so
        *outs, padded, message = outs
        want = jax.tree_util.tree_leaves(jm.padded(*[a.numpy() for a in cases[0]]))
        assert len(padded) == len(want), name
        for g, w in zip(padded, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5, err_msg=name)
        assert message is not None and ".padded(" in message, (name, message)
        text = (tmp_path / name / "model.py").read_text()
        assert "@nnx.jit\n    def padded(self" in text and "trim_padded(" in text
        paths = set()
        for k, (case, got) in enumerate(zip(cases, outs)):
            compare(name, k, model, jm, case, got)
            paths.add(load(name).path_of(model, case))
        assert len(paths) >= 2, (name, paths)


@pytest.mark.parametrize("name", PADDED_MODELS)
def test_padded_decisions_are_the_dispatch_hosts(name: str) -> None:
    # only reached iterations decide: the trace is the one the dispatch host (Python control
    # flow) records, but for captioning's `word.item() == end or step >= max_len`, which on
    # its last iteration the Python bound decides in the padded program (no tensor decision)
    mod = load(name)
    model, jm = _converted(name)
    _, jd = _converted(name, "dispatch")
    for args in mod.inputs(12, seed=5):
        padded = _decisions(jm.trace(*args)[1])
        dispatched = _decisions(jd.trace(*args)[1])
        if name == "captioning" and len(padded) != len(dispatched):
            assert dispatched == padded + [(dispatched[-1][0], 1)]
            assert mod.path_of(model, args) == (("length", mod.MAX_LEN + 1),)
        else:
            assert padded == dispatched


class BoundedDecoder(nn.Module):
    """Greedy decode with a Python step bound and a tensor stop, research style."""

    def __init__(self, max_steps: int, vocab: int = 12, hidden: int = 16, end: int = 0):
        super().__init__()
        self.max_steps = max_steps
        self.end = end
        self.embed = nn.Embedding(vocab, hidden)
        self.cell = nn.GRUCell(hidden, hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, h):
        tok = torch.full((1,), 1, dtype=torch.long)
        tokens = []
        for step in range(self.max_steps):
            h = self.cell(self.embed(tok), h)
            tok = self.out(h).argmax(-1)
            tokens.append(tok)
            if tok.item() == self.end:
                break
        return torch.stack(tokens, 1), h


def _decoder(max_steps: int) -> BoundedDecoder:
    torch.manual_seed(3)
    model = BoundedDecoder(max_steps).eval()
    with torch.no_grad():
        model.out.bias[0] += 1.0  # <end> likely enough that some inputs stop early
    return model


def _hidden(n: int) -> list[tuple]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(1, 16, generator=g) * 2,) for _ in range(n)]


def test_a_loop_its_bound_ends_within_sixteen_stages_and_matches() -> None:
    model = _decoder(6)
    jm = dycl_jax.to_jax(model, _hidden(1)[0])
    assert jm.host == "staged"
    lengths = set()
    for args in _hidden(N_INPUTS):
        _check(model, jm, args)
        lengths.add(model(*args)[0].shape[1])
    assert len(lengths) >= 2, lengths


def test_a_bound_past_sixteen_runs_on_dispatch_and_staged_refuses_with_the_location() -> None:
    model = _decoder(20)
    jm = dycl_jax.to_jax(model, _hidden(1)[0])
    assert jm.host == "dispatch"
    assert "test_auto_padded.py:" in jm.report().dispatch_reason
    for args in _hidden(8):
        assert_same(model(*args), jm(*args), "dispatch")
    with pytest.raises(DyclError, match=r"(?s)test_auto_padded\.py:\d+.*host=\"dispatch\"") as info:
        dycl_jax.to_jax(model, _hidden(1)[0], host="staged")
    assert "Guard" not in str(info.value)


class StopOnTensorOnly(nn.Module):
    """`while True` that only the data ends: no bound, so no padded program."""

    def __init__(self):
        super().__init__()
        self.step = nn.Linear(4, 4)

    def forward(self, x):
        outs = []
        while True:
            x = torch.tanh(self.step(x))
            outs.append(x)
            if x.sum() > 0 or len(outs) > 40:
                break
        return torch.cat(outs, 0)


def test_a_loop_only_tensors_stop_runs_on_dispatch() -> None:
    torch.manual_seed(0)
    model = StopOnTensorOnly().eval()
    x = torch.randn(1, 4)
    jm = dycl_jax.to_jax(model, (x,))
    assert jm.host == "dispatch"
    for x in torch.randn(8, 1, 4):
        assert_same(model(x[None] if x.dim() == 1 else x), jm(x[None] if x.dim() == 1 else x), "dispatch")


class InnerIf(nn.Module):
    """A decode loop whose body branches on a tensor: the branch decides only where reached."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.head = nn.Linear(8, 5)

    def forward(self, h):
        seq = torch.zeros(1, 0, dtype=torch.long)
        for t in range(5):
            if h.mean() > 0:
                h = torch.tanh(self.a(h))
            else:
                h = torch.relu(self.b(h)) - 0.1
            tok = F.log_softmax(self.head(h), -1).argmax(-1, keepdim=True)
            seq = torch.cat([seq, tok], 1)
            if tok.item() == 4:
                break
        return seq


def test_an_inner_if_decides_only_in_reached_iterations() -> None:
    torch.manual_seed(1)
    model = InnerIf().eval()
    g = torch.Generator().manual_seed(2)
    inputs = [(torch.randn(1, 8, generator=g),) for _ in range(N_INPUTS)]
    jm = dycl_jax.to_jax(model, inputs[0])
    jd = dycl_jax.to_jax(model, inputs[0], host="dispatch")
    assert jm.host == "staged"
    lengths = set()
    for args in inputs:
        decisions = _check(model, jm, args)
        assert decisions == _decisions(jd.trace(*args)[1])
        lengths.add(model(*args).shape[1])
    assert len(lengths) >= 2, lengths


def test_max_len_on_a_method_without_a_loop_returns_exact_values() -> None:
    # the `if` joins pad the return value; calls trim it (it was returned padded before)
    mod = load("shape_branch")
    model, args = mod.example()
    jm = dycl_jax.to_jax(model, args, host="staged", max_len=4)
    for args in mod.inputs(10, seed=1):
        with torch.no_grad():
            assert_same(model(*args), jm(*args), "max_len")


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_trim_cuts_padding_exactly(dtype: str) -> None:
    """`trim` (runtime/loaded.py) keeps the leading `lengths` of every axis, of a device array (a
    jitted cut per true shape) and of a numpy one alike; nothing to cut returns the array itself."""
    import jax
    import numpy as np

    from dycl_jax.runtime.loaded import trim

    full = (np.arange(4 * 5 * 3).reshape(4, 5, 3) % 7).astype(dtype)
    device = jax.numpy.asarray(full)
    for lengths in ([4, 5, 3], [1, 5, 3], [4, 2, 1], [0, 5, 3], [2, 3, 2]):
        want = full[: lengths[0], : lengths[1], : lengths[2]]
        for value in (device, full):
            got = trim(value, jax.numpy.asarray(lengths, dtype="int32"))
            assert got.shape == want.shape and np.asarray(got).dtype == want.dtype, (lengths, got.shape)
            np.testing.assert_array_equal(np.asarray(got), want)
        if lengths != [4, 5, 3]:
            assert trim(device, np.array(lengths)) is not device
    assert trim(device, np.array([4, 5, 3])) is device  # nothing padded: no program runs


@pytest.mark.parametrize("name", ["captioning", "shape_branch"])  # (greedy_nmt returns tokens only)
def test_padded_gradients_match_torch_autograd(name: str) -> None:
    """`jax.grad` of `jm.apply` (the padded program, its loss over the true part of each padded
    output) equals torch autograd on the original model, one input per output length."""
    from gradient_parity import assert_gradients_match, one_per_path

    mod = load(name)
    model, jm = _converted(name)
    assert jm.host == "staged"
    cases = one_per_path(mod, model, mod.inputs(N_INPUTS))
    assert len(cases) >= 2, "the inputs should give several output lengths"
    assert_gradients_match(model, jm, cases, name)


class AppendOrBreak(nn.Module):
    """An exit path that reads what the other path changes in place: `outs.append` and `h.mul_`
    on one path of a tensor `if`, `break` on the other, `len(outs)` and `h` read after the loop.
    The padded program runs both paths of the exit; before, they shared `outs` and `h` in the
    loop's first iteration (a branch Python decided), so an input that breaks at once returned
    len 1 and the doubled `h` (fuzz seed 487629210)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        outs = []
        for _ in range(3):
            if h.sum() > 0:
                outs.append(h.sum())
                h.mul_(0.5)
            else:
                break
        total = torch.stack(outs).sum() if outs else h.sum() * 0.0
        return h + total, len(outs)


@pytest.mark.parametrize("host", ["auto", "staged"])
def test_both_paths_of_a_padded_exit_keep_their_own_list_and_tensor(host: str) -> None:
    torch.manual_seed(0)
    model = AppendOrBreak().eval()
    jm = dycl_jax.to_jax(model, (torch.randn(2, 4),), host=host)
    assert jm.host == "staged"
    lengths = set()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for k in range(N_INPUTS):
            x = torch.randn(2, 4, generator=g)
            want = model(x)
            lengths.add(want[1])
            assert_same(want, jm(x), f"input {k}")
    assert lengths == {0, 3}, lengths
