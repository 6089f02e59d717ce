"""Emitted source of a `train=True` conversion: the module's `__call__` runs torch's training
mode (batch statistics, dropout drawing from `key=` / `rngs=`) and writes the updated BatchNorm
statistics (`nnx.BatchStat`) into the module; compared over several steps with the ORIGINAL
torch model in training mode and with `jm`, on every path, jitted (state split and merged) and
called eagerly."""
from __future__ import annotations

import importlib.util

import jax
import numpy as np
import pytest
import torch
from flax import nnx

import dycl_jax
from test_train_mode import _REFINED, DIM, GatedExitNet, LoopDrop, RefinedNorm, _fresh, _inputs, _shifted


def _load(jm, out, name: str, **kw):
    spec = importlib.util.spec_from_file_location(name, jm.emit(str(out)))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (out / "model.py").read_text()
    imports = {ln.split()[1].split(".")[0] for ln in text.splitlines() if ln.startswith(("import ", "from "))}
    assert imports <= {"os", "jax", "numpy", "safetensors", "flax"}, imports
    return module.load(**kw), text


def _stats(model) -> dict[str, np.ndarray]:
    """The module's nnx.BatchStat values by torch path."""
    return {".".join(map(str, p)): np.asarray(v.get_raw_value())
            for p, v in nnx.state(model, nnx.BatchStat).flat_state()}


def _jm_stats(jm) -> dict[str, np.ndarray]:
    return {".".join(map(str, p)): np.asarray(v.get_raw_value()) for p, v in nnx.state(jm.module).flat_state()
            if isinstance(v, nnx.BatchStat)}


def _same_stats(got: dict, ref: torch.nn.Module, what: str) -> None:
    assert set(got) == {n for n, _ in ref.named_buffers()}, what
    for name, buf in ref.named_buffers():
        if buf.dtype == torch.int64:
            assert int(got[name]) == int(buf), (what, name)
        else:
            np.testing.assert_allclose(got[name], buf.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"{what} {name}")


def _jitted(model):
    """A jitted step of the emitted module: the state goes in and the updated state comes out."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def step(state, x, key):
        m = nnx.merge(graphdef, state)
        out = m(x, key=key) if key is not None else m(x)
        return out, nnx.state(m)

    def call(x, key=None):
        nonlocal state
        out, state = step(state, x, key)
        nnx.update(model, state)
        return out
    return call


def test_train_mode_module_matches_torch_and_jm_on_every_path(tmp_path):
    """Dropout p=0 and three BatchNorms (one in a gated block, one on the late path only):
    outputs, exit ids and every running statistic after each step equal torch's in train mode
    and jm's, jitted and eagerly."""
    model, ref = _fresh()
    base = _inputs()
    jm = dycl_jax.to_jax(model, (base,), train=True)
    emitted, text = _load(jm, tmp_path / "m", "emitted_gated_train")
    eager, _ = _load(jm, tmp_path / "m", "emitted_gated_train_eager")
    run = _jitted(emitted)
    assert "nnx.BatchStat" in text and "key=None" not in text  # p=0 draws no key: none taken
    # parameters are nnx.Param (what an optimizer trains), the statistics nnx.BatchStat
    params = {".".join(map(str, p)) for p, _ in nnx.state(emitted, nnx.Param).flat_state()}
    assert {n for n, _ in model.named_parameters()} == {p.replace("kernel", "weight") for p in params}
    seen = set()
    for step, (gate_open, early) in enumerate([(True, True), (False, False), (True, False), (False, True),
                                               (True, False)]):
        x = _shifted(model, base + 0.1 * step, gate_open, early)
        want_out, want_exit = ref(x)
        mine = jm(x.numpy())
        # eagerly on the first two steps only (an eager lax.cond compiles at every call)
        for got in (run(x.numpy()), eager(x.numpy())) if step < 2 else (run(x.numpy()),):
            assert int(got[1]) == int(mine[1]) == want_exit == (0 if early else 1), step
            np.testing.assert_allclose(np.asarray(got[0]), want_out.detach().numpy(), rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(np.asarray(got[0]), np.asarray(mine[0]), rtol=1e-5, atol=1e-6)
        _same_stats(_stats(emitted), ref, f"step {step}")
        if step < 2:
            _same_stats(_stats(eager), ref, f"eager step {step}")
        _same_stats(_jm_stats(jm), ref, f"jm step {step}")
        seen.add((gate_open, early))
    assert len(seen) == 4


def test_batchnorm_in_a_while_body_and_nested_branches(tmp_path):
    """Running statistics carried through a tensor `while` (BatchNorm in both arms of a branch
    in its body) and updated in an if/elif/else with a nested branch: against torch and jm."""
    model, ref = _fresh(RefinedNorm)
    g = torch.Generator().manual_seed(5)
    jm = dycl_jax.to_jax(model, (torch.randn(8, DIM, generator=g),), train=True)
    emitted = _load(jm, tmp_path / "m", "emitted_refined_train")[0]
    run = _jitted(emitted)
    for step, (steps, score) in enumerate(_REFINED):
        x = torch.randn(8, DIM, generator=g)
        x[:, 0] += steps - x[:, 0].mean()
        x[:, 1] += score - x[:, 1].mean()
        want = ref(x)
        mine, got = jm(x.numpy()), run(x.numpy())
        assert int(got[1]) == int(mine[1]) == want[1], step
        np.testing.assert_allclose(np.asarray(got[0]), want[0].detach().numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.asarray(got[0]), np.asarray(mine[0]), rtol=1e-5, atol=1e-6)
        _same_stats(_stats(emitted), ref, f"step {step}")


def test_dropout_draws_as_jm_does_for_one_key_and_another_for_another(tmp_path):
    """p=0.5 at the top level and in a branch: `model(x, key=k)` equals `jm(x, key=k)` (same
    masks, same statistics); another key gives another mask; calls without a key draw from
    `load(rngs=...)` as jm's from `jm.rngs` (both nnx.Rngs(0) here)."""
    model, _ = _fresh(p=0.5)
    base = _inputs()
    jm = dycl_jax.to_jax(model, (base,), train=True)
    emitted, text = _load(jm, tmp_path / "m", "emitted_dropout_train", rngs=nnx.Rngs(0))
    assert "dropout(" in text and "key=None" in text
    run = _jitted(emitted)
    x = _shifted(model, base, True, False).numpy()  # the gated block and the deep head: every BatchNorm
    k1, k2 = jax.random.key(7), jax.random.key(8)
    a, mine = run(x, k1), jm(x, key=k1)
    np.testing.assert_allclose(np.asarray(a[0]), np.asarray(mine[0]), rtol=1e-5, atol=1e-6)
    for name, v in _jm_stats(jm).items():
        np.testing.assert_allclose(_stats(emitted)[name], v, rtol=1e-6, atol=1e-6, err_msg=name)
    b = run(x, k2)
    assert not np.allclose(np.asarray(a[0]), np.asarray(b[0]))  # another key, another mask
    for _ in range(2):  # no key: each call the next key of the Rngs, as jm
        np.testing.assert_allclose(np.asarray(run(x)[0]), np.asarray(jm(x)[0]), rtol=1e-5, atol=1e-6)


def test_dropout_in_a_branch_in_a_while_loop_draws_per_iteration_as_jm(tmp_path):
    x = torch.ones(4, 2500)
    jm = dycl_jax.to_jax(LoopDrop(), (x,), train=True)
    run = _jitted(_load(jm, tmp_path / "m", "emitted_loopdrop_train")[0])
    for k in (3, 4):
        key = jax.random.key(k)
        got = np.asarray(run(x.numpy(), key))
        np.testing.assert_array_equal(got, np.asarray(jm(x.numpy(), key=key)))
        assert set(np.unique(got)) == {0.0, 2.0, 4.0}  # two iterations, two masks
    np.testing.assert_array_equal(np.asarray(run(-x.numpy())), 2 * np.ones((4, 2500)))  # the other branch


def test_dispatch_host_train_model_emits_and_matches_torch_and_jm(tmp_path):
    """host="dispatch": each emitted region method takes its region key and writes the statistics
    it updates. Dropout p=0: outputs, exit ids and every statistic against torch's train mode on
    every path; p=0.5: `model(x, key=k)` equals `jm(x, key=k)`, another key another mask."""
    model, ref = _fresh()
    base = _inputs()
    jm = dycl_jax.to_jax(model, (base,), train=True, host="dispatch")
    emitted, text = _load(jm, tmp_path / "m", "emitted_gated_dispatch_train")
    assert "def region_key()" in text and "nnx.BatchStat" in text and "@nnx.jit" in text
    seen = set()
    for step, (gate_open, early) in enumerate([(True, True), (False, False), (True, False), (False, True),
                                               (True, False)]):
        x = _shifted(model, base + 0.1 * step, gate_open, early)
        want_out, want_exit = ref(x)
        got, mine = emitted(x.numpy(), key=jax.random.key(step)), jm(x.numpy(), key=jax.random.key(step))
        assert int(got[1]) == int(mine[1]) == want_exit == (0 if early else 1), step
        np.testing.assert_allclose(np.asarray(got[0]), want_out.detach().numpy(), rtol=1e-4, atol=1e-5)
        _same_stats(_stats(emitted), ref, f"step {step}")
        _same_stats(_jm_stats(jm), ref, f"jm step {step}")
        seen.add((gate_open, early))
    assert len(seen) == 4
    model, _ = _fresh(p=0.5)
    jm = dycl_jax.to_jax(model, (base,), train=True, host="dispatch")
    emitted, _ = _load(jm, tmp_path / "p", "emitted_gated_dispatch_dropout", rngs=nnx.Rngs(0))
    x = _shifted(model, base, True, False).numpy()
    k1, k2 = jax.random.key(7), jax.random.key(8)
    a, mine = emitted(x, key=k1), jm(x, key=k1)
    np.testing.assert_allclose(np.asarray(a[0]), np.asarray(mine[0]), rtol=1e-5, atol=1e-6)
    for name, v in _jm_stats(jm).items():
        np.testing.assert_allclose(_stats(emitted)[name], v, rtol=1e-6, atol=1e-6, err_msg=name)
    assert not np.allclose(np.asarray(a[0]), np.asarray(emitted(x, key=k2)[0]))  # another key, another mask


class Draws(torch.nn.Module):
    """The random factories the emission table holds, beside dropout."""

    def forward(self, x):
        return x + torch.rand_like(x), torch.randn_like(x) * 2, torch.bernoulli(x, 0.25)


def test_random_factories_draw_as_jm_does(tmp_path):
    x = torch.ones(3, 500)
    jm = dycl_jax.to_jax(Draws(), (x,), train=True)
    emitted, _ = _load(jm, tmp_path / "m", "emitted_draws_train")
    key = jax.random.key(5)
    got, mine = emitted(x.numpy(), key=key), jm(x.numpy(), key=key)
    for g, m in zip(got, mine):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(m))
    assert abs(float(np.asarray(got[2]).mean()) - 0.25) < 0.05  # bernoulli at p=0.25
