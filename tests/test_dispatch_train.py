"""`to_jax(..., train=True)` on the dispatch host: every region on batch statistics, its running
statistics written into the model state before the next region and the next call, random ops
keyed per region call; compared with the ORIGINAL torch model in training mode over several
calls (a decode loop that needs the dispatch host, and skipnet run with host="dispatch")."""
from __future__ import annotations

import copy

import jax
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from flax import nnx

import dycl_jax
from dycl_jax.errors import CallError, DyclError
from examples.dynn import load

DIM = 6


class HaltingDecoder(nn.Module):
    """A decode loop as research code writes it: tokens grown with torch.cat (a shape per step,
    so it cannot stage), thresholds in a Python list, the stop read with `.item()`, a
    BatchNorm (cumulative average) and dropout inside the loop body, one outside; each step
    also draws a word-dropout style keep mask (p=0.4) that the outputs do not depend on."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(DIM, DIM), nn.BatchNorm1d(DIM))
        self.cell = nn.Linear(DIM, DIM)
        self.norm = nn.BatchNorm1d(DIM, momentum=None)
        self.drop = nn.Dropout(p)
        self.halt = nn.Linear(DIM, 1)
        self.thresholds = [0.8, 0.6]

    def forward(self, x):
        h = F.relu(self.embed(x))
        tokens = torch.zeros(x.shape[0], 0, dtype=torch.long)
        keeps = []
        for threshold in self.thresholds:
            h = x + self.drop(torch.tanh(self.norm(self.cell(h))))
            tokens = torch.cat([tokens, h.argmax(1, keepdim=True)], 1)
            keeps.append(F.dropout(torch.ones(x.shape[0], 1000), 0.4, self.training))
            confidence = torch.sigmoid(self.halt(h)).mean()
            if confidence.item() > threshold:
                break
        return h, tokens, keeps


def _stats(jm) -> dict[str, np.ndarray]:
    return {".".join(map(str, p)): np.asarray(v.get_raw_value()) for p, v in nnx.state(jm.module).flat_state()
            if isinstance(v, nnx.BatchStat)}


def _assert_stats_match(got: dict[str, np.ndarray], ref: nn.Module, step: object) -> None:
    """Every running statistic of the torch twin: counts exactly, floats within 1e-5."""
    for name, buf in ref.named_buffers():
        if buf.dtype == torch.int64:
            assert int(got[name]) == int(buf), (step, name)
        else:
            np.testing.assert_allclose(got[name], buf.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"{step} {name}")


def _assert_emitted_stats_match(got: dict[str, np.ndarray], ref: nn.Module, step: object) -> None:
    """An emitted module's statistics against the torch twin's: it holds a buffer registered under
    two names (skipnet's downsample shortcuts) once, under either; every buffer is held."""
    named = dict(ref.named_buffers(remove_duplicate=False))
    assert set(got) <= set(named), set(got) - set(named)
    assert {id(named[k]) for k in got} == {id(b) for b in ref.buffers()}
    for name in got:
        if named[name].dtype == torch.int64:
            assert int(got[name]) == int(named[name]), (step, name)
        else:
            np.testing.assert_allclose(got[name], named[name].numpy(), rtol=1e-5, atol=1e-5, err_msg=f"{step} {name}")


def _twins(cls, *args):
    torch.manual_seed(0)
    model = cls(*args)
    ref = copy.deepcopy(model).train()
    return model.eval(), ref


def test_decode_loop_with_batchnorm_and_dropout_in_its_body_matches_torch_train_mode():
    """Dropout p=0 in the body: outputs, tokens and statistics against torch over calls that stop
    at every step; the p=0.4 masks: a key per region call (per loop iteration)."""
    model, ref = _twins(HaltingDecoder)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    w = model.halt.weight.detach()[0]
    base = torch.randn(8, DIM, generator=torch.Generator().manual_seed(1))
    jm = dycl_jax.to_jax(model, (base,), train=True)
    assert jm.host == "dispatch" and jm.dispatch_location.file == __file__
    assert set(_stats(jm)) == {n for n, _ in ref.named_buffers()}
    lengths = []
    # the shift along the halting weights sets where the loop ends: a break at step 1 or 2, or none
    for step, shift in enumerate([5.0, 1.5, -2.0, 1.5, 5.0, -2.0]):
        x = base * (1 + 0.1 * step) + shift * w / w.norm()
        want_h, want_tokens, _ = ref(x)
        got_h, got_tokens, keeps = jm(x.numpy())
        np.testing.assert_array_equal(np.asarray(got_tokens), want_tokens.numpy())
        np.testing.assert_allclose(np.asarray(got_h), want_h.detach().numpy(), rtol=1e-5, atol=1e-5)
        _assert_stats_match(_stats(jm), ref, step)
        lengths.append(want_tokens.shape[1])
        assert len(keeps) == lengths[-1]
    assert lengths == [1, 2, 2, 2, 1, 2]
    assert int(ref.norm.num_batches_tracked) == 2 * 1 + 4 * 2  # one update per loop iteration
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())  # the user's model untouched
    # the last call's masks (2 iterations): kept values exactly 1/(1-p), at rate 1-p (0.025 is
    # 4.5 standard deviations over 8000), and independent per iteration (disagreeing on 48%)
    keeps = [np.asarray(k) for k in keeps]
    for k in keeps:
        np.testing.assert_array_equal(k[k != 0], np.float32(1 / 0.6))
        assert abs((k != 0).mean() - 0.6) < 0.025
    assert abs(((keeps[0] != 0) != (keeps[1] != 0)).mean() - 0.48) < 0.035
    nxt = np.asarray(jm(x.numpy())[2][0])  # no key: the next one of jm.rngs
    ref(x)
    assert abs(((nxt != 0) != (keeps[0] != 0)).mean() - 0.48) < 0.035
    # jm.trace: the host's decisions, statistics left as they are
    before = _stats(jm)
    x = base + 1.5 * w / w.norm()
    _, decisions = jm.trace(x.numpy())
    assert [v for _, v in decisions] == [False, True]
    assert all(np.array_equal(v, before[k]) for k, v in _stats(jm).items())
    # the pure form: outputs and new statistics from the state given, the module untouched; the
    # same key gives the same masks, another key others
    state = nnx.state(jm.module)
    (h, _, keeps), new_state = jm.apply(state, x.numpy(), key=jax.random.key(0))
    want_h, _, _ = ref(x)
    np.testing.assert_allclose(np.asarray(h), want_h.detach().numpy(), rtol=1e-5, atol=1e-5)
    _assert_stats_match({".".join(map(str, p)): np.asarray(v.get_raw_value())
                         for p, v in nnx.state(new_state, nnx.BatchStat).flat_state()}, ref, "apply")
    assert all(np.array_equal(v, before[k]) for k, v in _stats(jm).items())
    (_, _, again), _ = jm.apply(state, x.numpy(), key=jax.random.key(0))
    (_, _, other), _ = jm.apply(state, x.numpy(), key=jax.random.key(1))
    assert all(np.array_equal(a, b) for a, b in zip(keeps, again))
    assert ((np.asarray(other[0]) != 0) != (np.asarray(keeps[0]) != 0)).mean() > 0.3
    with pytest.raises(CallError, match="key"):
        jm.apply(state, x.numpy())


def test_skipped_blocks_on_the_dispatch_host_match_torch_train_mode():
    """Skipped blocks (each block's BatchNorms only on the path that runs it, skipnet's
    downsample shortcuts registered under two names), over calls taking both paths (in train
    mode: batch statistics decide the gates). An early exit on the host is the decode loop's."""
    name, paths = "skipnet_ff", 2
    example = load(name)
    model, args = example.example()
    ref = copy.deepcopy(model).train()
    jm = dycl_jax.to_jax(model, args, train=True, host="dispatch")
    taken = set()
    for step, (x,) in enumerate(example.inputs(4, seed=3)):
        taken.add(example.path_of(copy.deepcopy(ref), (x,)))  # the path in train mode
        with torch.no_grad():
            want = ref(x)
        got = jm(x.numpy())
        for w, g in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(got)):
            if isinstance(w, torch.Tensor) and w.is_floating_point():
                np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-5, atol=1e-5, err_msg=str(step))
            else:  # exit ids and flags
                assert np.array_equal(np.asarray(g), np.asarray(w)), (step, g, w)
        _assert_stats_match(_stats(jm), ref, step)
    assert len(taken) == paths


def test_a_root_whose_forward_is_torch_code_runs_on_the_dispatch_host_in_train_mode():
    """nn.Sequential's forward is torch's own (never rewritten): the host runs it as one region
    on tensors, not torch code on its arrays; outputs and running statistics against torch's
    train mode over three calls at two batch sizes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Dropout(0.0))
    ref = copy.deepcopy(model).train()
    jm = dycl_jax.to_jax(model, (torch.randn(5, 4),), train=True, host="dispatch")
    for step, n in enumerate((5, 7, 5)):
        x = torch.randn(n, 4)
        with torch.no_grad():
            want = ref(x)
        np.testing.assert_allclose(np.asarray(jm(x.numpy(), key=jax.random.key(step))), want.numpy(), rtol=1e-5, atol=1e-5)
        _assert_stats_match(_stats(jm), ref, step)
    assert int(_stats(jm)["1.num_batches_tracked"]) == 3


class PickedRows(nn.Module):
    """Random numbers sized by a Python int read from the data (a compiled region's, keyed), and,
    on two other paths, random numbers or a BatchNorm on rows picked by a mask in the same
    statement: host statements (torch.export cannot size them), which neither the key nor the
    JAX state reaches."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(DIM)

    def forward(self, x):
        n = int((x[:, 0] > 0).sum())
        noise = torch.rand(n, DIM)
        if x[0, 1] > 1:
            return noise, torch.rand_like(x[x[:, 0] > 0]).sum()
        if x[0, 1] < -1:
            return noise, self.bn(x[x[:, 0] > 0]).sum()
        return noise, x.sum()


def test_random_sizes_from_data_run_and_host_statements_that_draw_or_update_are_located_errors():
    model = PickedRows()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(8, DIM, generator=torch.Generator().manual_seed(2))
    x[0, 1] = 0.0
    jm = dycl_jax.to_jax(model, (x,), train=True, host="dispatch")
    n = int((x[:, 0] > 0).sum())
    noise = np.asarray(jm(x.numpy(), key=jax.random.key(5))[0])
    assert noise.shape == (n, DIM) and noise.min() >= 0 and noise.max() < 1 and len(np.unique(noise)) == n * DIM
    assert np.array_equal(noise, np.asarray(jm(x.numpy(), key=jax.random.key(5))[0]))
    before = _stats(jm)
    for value, says, code in ((2.0, "draws random numbers", "rand_like"), (-2.0, "updates a model buffer", "self.bn")):
        x[0, 1] = value
        with pytest.raises(DyclError, match=says) as err:
            jm(x.numpy())
        assert err.value.location.file == __file__ and code in err.value.location.code and err.value.fix
    assert all(np.array_equal(v, before[k]) for k, v in _stats(jm).items())
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())  # torch's statistics untouched


class _Block(nn.Module):
    def __init__(self, project: bool):
        super().__init__()
        self.lin, self.norm = nn.Linear(DIM, DIM), nn.BatchNorm1d(DIM)
        self.proj = nn.Linear(DIM, DIM) if project else None

    def forward(self, x):
        h = torch.relu(self.norm(self.lin(x)))
        if self.proj is not None:
            x = self.proj(x)
        return h + x


class ReusedBlock(nn.Module):
    """A block called unconditionally and again under a gate read with `.item()`: host="dispatch"
    stages the whole forward as one island, whose graph calls the block as a module."""

    def __init__(self):
        super().__init__()
        self.first, self.block = _Block(True), _Block(False)

    def forward(self, x):
        h = self.block(self.first(x))
        if h.mean().item() > 0.5:
            h = self.block(h)
        return h


def test_emitted_dispatch_host_in_train_mode_matches_torch_and_the_converted_model(tmp_path):
    """The emitted module of a dispatch-host model (loaded where torch cannot be imported). In
    train mode each compiled region method takes its region key and writes the statistics it
    updates: outputs and running statistics follow the ORIGINAL torch model in training mode, and
    the random masks are jm's for the same key (the decode loop, taking 1 and 2 steps). A block
    whose host method never ran but which an island's graph calls gets the graph's code (it
    raised "never ran" on every input before; eval and train mode, both paths of the gate)."""
    from emit_jobs import run_emitted

    model, ref = _twins(HaltingDecoder)
    w = model.halt.weight.detach()[0]
    base = torch.randn(8, DIM, generator=torch.Generator().manual_seed(1))
    xs = [base * (1 + 0.1 * step) + shift * w / w.norm() for step, shift in enumerate([5.0, 1.5, -2.0, 1.5])]
    jm = dycl_jax.to_jax(model, (base,), train=True)
    for x in xs * 2:  # every signature seen twice: islands over new int values compile on the second
        jm(x.numpy())
        ref(x)
    jm.emit(str(tmp_path / "decoder"))
    reused, reused_ref = _twins(ReusedBlock)
    r_xs = [base, base + 2.0]
    jobs = {"decoder": (str(tmp_path / "decoder"), [((x.numpy(),), 10 + i) for i, x in enumerate(xs)], "train")}
    for train in (False, True):
        r_jm = dycl_jax.to_jax(reused, (base,), train=train, host="dispatch")
        for x in r_xs:
            r_jm(x.numpy())
            if train:  # the torch twin takes the same steps
                with torch.no_grad():
                    reused_ref(x)
        r_jm.emit(str(tmp_path / f"reused_{train}"))
        calls = [((x.numpy(),), i) for i, x in enumerate(r_xs)] if train else [(x.numpy(),) for x in r_xs]
        jobs[f"reused_{train}"] = (str(tmp_path / f"reused_{train}"), calls, "train" if train else "only")
    got = run_emitted(tmp_path, jobs)
    status, outs = got["decoder"]
    assert status == "ok", outs
    lengths = []
    for i, (x, (h, tokens, keeps)) in enumerate(zip(xs, outs)):
        want_h, want_tokens, _ = ref(x)
        np.testing.assert_array_equal(tokens, want_tokens.numpy())
        np.testing.assert_allclose(h, want_h.detach().numpy(), rtol=1e-5, atol=1e-5)
        _, _, jm_keeps = jm(x.numpy(), key=jax.random.key(10 + i))
        assert len(keeps) == len(jm_keeps) == tokens.shape[1]
        for k, j in zip(keeps, jm_keeps):  # the same masks: the same region keys, drawn alike
            np.testing.assert_array_equal(k, np.asarray(j))
        lengths.append(tokens.shape[1])
    assert sorted(set(lengths)) == [1, 2]
    _assert_emitted_stats_match(outs[-1], ref, "emitted decoder")
    with torch.no_grad():  # both paths of the gate are taken (eval mode: no statistics change)
        assert {bool(reused.block(reused.first(x)).mean() > 0.5) for x in r_xs} == {True, False}
    for train in (False, True):
        status, outs = got[f"reused_{train}"]
        assert status == "ok", outs
        for step, (x, g) in enumerate(zip(r_xs, outs)):
            with torch.no_grad():
                want = (reused_ref if train else reused)(x)
            np.testing.assert_allclose(np.asarray(g), want.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"{train} {step}")
        if train:
            _assert_emitted_stats_match(outs[-1], reused_ref, "emitted reused block")
