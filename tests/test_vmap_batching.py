"""vmap of `jm.apply` over single samples: per-sample paths equal torch's, weights never batched."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import numpy as np

import pytest
import torch
from flax import nnx

import converted  # tests/: the example conversions this process made already
from dycl_jax.lower.batching import batchable_cond, counting, guarded, mapped
from dycl_jax.rewrite.api import run_torch_trace
from examples.dynn import load

SAMPLES = 8
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _converted(name: str):
    mod = load(name)
    model, jm = converted.default(name)
    return mod, model, mod.example()[1], jm


def _stack(inputs: list[tuple]) -> list[np.ndarray]:
    return [np.stack([args[i].numpy() for args in inputs]) for i in range(len(inputs[0]))]


def _eqn_shapes(jaxpr: jax.extend.core.Jaxpr) -> set[tuple[int, ...]]:
    """Every intermediate shape in a jaxpr, sub-jaxprs (cond branches, loop bodies) included."""
    shapes = set()
    for eqn in jaxpr.eqns:
        shapes.update(tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if isinstance(inner, jax.extend.core.Jaxpr):
                    shapes |= _eqn_shapes(inner)
    return shapes


@pytest.mark.parametrize("name", ["shallow_deep", "skipnet_ff", "act"])
def test_vmap_apply_matches_torch_per_sample(name: str) -> None:
    mod, model, args, jm = _converted(name)
    assert jm.host == "staged"
    inputs = mod.inputs(SAMPLES)
    paths = {mod.path_of(model, a) for a in inputs}
    assert len(paths) >= 2, "the samples must take different paths for this test to mean anything"
    state = nnx.state(jm.module)
    batched = jax.jit(jax.vmap(jm.apply, in_axes=(None,) + (0,) * len(args)))(state, *_stack(inputs))
    for i, a in enumerate(inputs):
        with torch.no_grad():
            want = jax.tree.leaves(model(*a))
        got = [np.asarray(leaf[i]) for leaf in jax.tree.leaves(batched)]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            w = np.asarray(w) if not isinstance(w, torch.Tensor) else w.numpy()
            if np.issubdtype(w.dtype, np.floating):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
            else:  # exit ids, step counts, masks: exactly
                np.testing.assert_array_equal(g.astype(w.dtype), w)


def test_vmap_keeps_weights_unbatched() -> None:
    # lax.cond's own vmap broadcasts every operand, the parameters too, to the batch
    mod, model, args, jm = _converted("skipnet_ff")
    state = nnx.state(jm.module)
    x = _stack(mod.inputs(SAMPLES))
    single = _eqn_shapes(jax.make_jaxpr(jm.apply)(state, x[0][0]).jaxpr)
    # a weight shape that is also an activation shape (a (1, C, 1, 1) gate) says nothing
    weights = {tuple(v.shape) for v in jax.tree.leaves(state) if np.ndim(v) >= 2} - single
    assert weights
    jaxpr = jax.make_jaxpr(jax.vmap(jm.apply, in_axes=(None, 0)))(state, *x)
    per_sample = {(SAMPLES,) + w for w in weights} & _eqn_shapes(jaxpr.jaxpr)
    assert not per_sample, f"parameters broadcast per sample: {sorted(per_sample)}"
    assert jaxpr.jaxpr.eqns  # the program was traced


def test_data_parallel_on_eight_devices() -> None:
    # a fresh process: the device count is fixed when JAX's backend starts
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "sharded_run.py")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sharded ok" in done.stdout


def test_vmap_decisions_match_torch_one_at_a_time() -> None:
    # each sample's decisions, logged inside the vmapped program by the vmap rule apply uses:
    # an `if` inside a tensor `while`, 0 to max iterations (7 paths over 8 samples)
    mod, model, args, jm = _converted("nested_while_if")
    inputs = mod.inputs(SAMPLES)
    want = [[tuple(d) for d in run_torch_trace(model, "forward", a)[1]] for a in inputs]
    assert len({tuple(w) for w in want}) >= 2, "the samples must take different paths"
    outs, got = jm.trace_batch(*_stack(inputs))
    assert [[tuple(d) for d in g] for g in got] == want
    with torch.no_grad():
        first = jax.tree.leaves(model(*inputs[0]))[0].numpy()
    np.testing.assert_allclose(np.asarray(jax.tree.leaves(outs)[0][0]), first, rtol=1e-4, atol=1e-4)


def _counted_cond(runs: dict[str, int], w: np.ndarray):
    """x -> batchable_cond(sum(x) > 0, x @ w, -(x @ w)), each branch counting its runs into `runs`."""
    def branch(name: str, scale: float):
        def fn(x, w):
            jax.debug.callback(lambda: runs.__setitem__(name, runs[name] + 1))
            return (x @ w * scale,)
        return fn

    return lambda x: batchable_cond(x.sum() > 0, branch("true", 1.0), branch("false", -1.0), (x, w))


def test_guarded_batched_cond_runs_a_branch_only_when_a_sample_takes_it() -> None:
    runs = {"true": 0, "false": 0}
    w = np.ones((3, 3), np.float32)
    f = _counted_cond(runs, w)
    xs = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    with guarded(), counting() as counts:
        fn = jax.jit(jax.vmap(f))
        out = jax.block_until_ready(fn(xs))  # every sample takes the true branch
    assert counts["select"] == 1
    np.testing.assert_allclose(out[0], xs @ w)
    assert runs == {"true": 1, "false": 0}
    mixed = xs * np.array([[1], [-1]], np.float32)
    out = jax.block_until_ready(fn(mixed))
    np.testing.assert_allclose(out[0], np.stack([mixed[0] @ w, -(mixed[1] @ w)]))
    assert runs == {"true": 2, "false": 1}


def test_mapped_batched_cond_runs_each_sample_through_its_own_branch() -> None:
    runs = {"true": 0, "false": 0}
    w = np.arange(9, dtype=np.float32).reshape(3, 3)
    f = _counted_cond(runs, w)
    xs = np.array([[1, 2, 3], [-4, -5, -6], [7, 8, 9]], np.float32)
    with mapped(), counting() as counts:
        out = jax.block_until_ready(jax.jit(jax.vmap(f))(xs))
    assert counts["loop"] == 1 and counts["select"] == 0
    # a loop over the samples, each a real cond: the true branch runs for two samples, the false for one
    assert runs == {"true": 2, "false": 1}
    np.testing.assert_allclose(out[0], np.stack([xs[0] @ w, -(xs[1] @ w), xs[2] @ w]))


def test_default_rule_loops_over_heavy_branches_and_selects_light_ones() -> None:
    kernel = np.ones((32, 3, 3, 3), np.float32)  # 2 * 16*16*32 * 27 = 4.4e5 flops per sample
    small = np.ones((3, 3), np.float32)

    def conv(x, k):
        return (jax.lax.conv_general_dilated(x[None], k, (1, 1), "SAME")[0].sum(axis=(1, 2))[:3],)

    def heavy(x):
        return batchable_cond(x.sum() > 0, conv, lambda x, k: (x.sum(axis=(1, 2)),), (x, kernel))

    def light(v):
        return batchable_cond(v.sum() > 0, lambda v, w: (v @ w,), lambda v, w: (-v,), (v, small))

    xs = np.random.default_rng(0).normal(size=(4, 3, 16, 16)).astype(np.float32)
    with counting() as counts:
        jax.make_jaxpr(jax.vmap(heavy))(xs)
    assert (counts["loop"], counts["select"]) == (1, 0)
    with counting() as counts:
        jax.make_jaxpr(jax.vmap(light))(xs[:, 0, 0, :3])
    assert (counts["loop"], counts["select"]) == (0, 1)
