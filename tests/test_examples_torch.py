"""Torch-side checks of the dynamic example models: path coverage, finite outputs, determinism."""

from __future__ import annotations

import contextlib
import math
import pathlib
import sys
from functools import lru_cache

import numpy as np
import pytest
import torch

# the examples live next to the package, not inside it
ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.dynn import BOUNDED_MODELS, CONSTANT_FLAG_MODELS, DISPATCH_MODELS, MODELS, load  # noqa: E402

ALL_MODELS = MODELS + DISPATCH_MODELS + BOUNDED_MODELS + CONSTANT_FLAG_MODELS
N_INPUTS = 50
MAX_PARAMS = 300_000
# outputs whose shapes or types depend on the path by design (decode lengths, shape-changing
# branches, an exit id that is an int, a 0-d tensor or np.int64): their structure must vary
VARYING_STRUCTURE = ("captioning", "captioning_teacher", "greedy_nmt", "shape_branch", "sdn_published")


def _leaves(out) -> list:
    """Tensors and Python/numpy scalars of a nested output, in order."""
    if isinstance(out, (list, tuple)):
        return [leaf for item in out for leaf in _leaves(item)]
    return [out]


def _signature(out):
    """The structure of an output with values abstracted: what a converter must reproduce."""
    if isinstance(out, (list, tuple)):
        return (type(out).__name__, tuple(_signature(item) for item in out))
    if isinstance(out, torch.Tensor):
        return ("tensor", tuple(out.shape), out.dtype)
    if isinstance(out, (bool, np.bool_)):
        return "bool"
    if isinstance(out, (int, np.integer)):
        return "int"
    if isinstance(out, float):
        return "float"
    return type(out).__name__


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and a == b


@contextlib.contextmanager
def _one_thread():
    # these models are tiny: intra-op threads only add synchronisation, and on a shared
    # machine they make the run many times slower
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@lru_cache(maxsize=None)
def _runs(name: str):
    """Two independently built models run over the same inputs, plus the paths taken."""
    mod = load(name)
    args_list = mod.inputs(N_INPUTS)
    model_a, _ = mod.example()
    model_b, _ = mod.example()
    with _one_thread(), torch.no_grad():
        outs_a = [model_a(*args) for args in args_list]
        outs_b = [model_b(*args) for args in args_list]
        paths = [mod.path_of(model_a, args) for args in args_list]
    return mod, model_a, model_b, args_list, outs_a, outs_b, paths


@pytest.mark.parametrize("name", ALL_MODELS)
def test_example_contract(name):
    mod = load(name)
    model, args = mod.example()
    assert not model.training, "example() must return an eval-mode model"
    assert isinstance(args, tuple) and args
    for arg in args:
        if isinstance(arg, torch.Tensor):
            assert arg.shape[0] == getattr(mod, "BATCH", 1), "examples are batch 1 unless BATCH says otherwise"
    n_params = sum(p.numel() for p in model.parameters())
    assert 0 < n_params < MAX_PARAMS, f"{name}: {n_params} parameters"
    first, second = mod.inputs(3, seed=1), mod.inputs(3, seed=1)
    assert len(first) == 3 and all(isinstance(a, tuple) for a in first)
    assert all(_same(x, y) for a, b in zip(first, second) for x, y in zip(a, b)), "inputs() must be seeded"
    other = mod.inputs(3, seed=2)
    assert not all(_same(x, y) for a, b in zip(first, other) for x, y in zip(a, b)), "seed must change inputs"
    assert len(set(mod.PATHS)) == len(mod.PATHS), "PATHS labels must be distinct"


@pytest.mark.parametrize("name", ALL_MODELS)
def test_every_path_taken(name):
    mod, *_, paths = _runs(name)
    taken: dict = {}
    for path in paths:
        hash(path)  # a path must be usable as a dict key
        for label in path:
            taken[label] = taken.get(label, 0) + 1
    unknown = set(taken) - set(mod.PATHS)
    assert not unknown, f"{name}: path_of returned labels missing from PATHS: {unknown}"
    missing = [label for label in mod.PATHS if label not in taken]
    assert not missing, f"{name}: paths never taken over inputs({N_INPUTS}): {missing}; taken: {taken}"


@pytest.mark.parametrize("name", ALL_MODELS)
def test_outputs_finite_and_fixed_structure(name):
    _, _, _, _, outs_a, _, paths = _runs(name)
    signatures = {}
    for out, path in zip(outs_a, paths):
        for leaf in _leaves(out):
            if isinstance(leaf, torch.Tensor):
                assert torch.isfinite(leaf).all(), f"{name}: non-finite output on path {path}"
            elif isinstance(leaf, float):
                assert math.isfinite(leaf)
        signatures.setdefault(_signature(out), path)
    if name in VARYING_STRUCTURE:
        assert len(signatures) > 1, f"{name}: output structure was meant to vary by path: {signatures}"
    else:
        # every path returns the same structure, so a converted model has one output signature
        assert len(signatures) == 1, f"{name}: output structure differs by path: {signatures}"


@pytest.mark.parametrize("name", ALL_MODELS)
def test_deterministic(name):
    _, model_a, model_b, args_list, outs_a, outs_b, _ = _runs(name)
    state_a, state_b = model_a.state_dict(), model_b.state_dict()
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a), "seeded init differs between builds"
    for i, (out_a, out_b) in enumerate(zip(outs_a, outs_b)):
        leaves_a, leaves_b = _leaves(out_a), _leaves(out_b)
        assert len(leaves_a) == len(leaves_b)
        assert all(_same(x, y) for x, y in zip(leaves_a, leaves_b)), f"{name}: input {i} gives different outputs"
    # and the same model called again gives the same answer (no state leaks between calls)
    with _one_thread(), torch.no_grad():
        again = model_a(*args_list[0])
    assert all(_same(x, y) for x, y in zip(_leaves(again), _leaves(outs_a[0])))


def test_msdnet_budget_stops_early():
    # the budgeted mode is a static condition: a budget for one block always exits there
    mod = load("anytime_msdnet")
    model, _ = mod.example()
    args_list = mod.inputs(10)
    with _one_thread(), torch.no_grad():
        exits_one = {model(*args, budget=model.block_cost[0])[1] for args in args_list}
        exits_two = {model(*args, budget=sum(model.block_cost[:2]))[1] for args in args_list}
        exits_free = {model(*args)[1] for args in args_list}
    assert exits_one == {0}
    assert exits_two <= {0, 1} and 1 in exits_two
    assert max(exits_free) > 1


def test_decode_outputs_consistent():
    # the decode loops stop where they say: lengths vary, and the side outputs agree with them
    *_, args_list, outs, _, _ = _runs("captioning")
    for seqs, alphas in outs:
        assert seqs[0, 0] == 1 and alphas.shape == (1, seqs.size(1) - 1, 16)
        assert (seqs[0, 1:-1] != 2).all(), "decoding continued past <end>"
    assert len({seqs.size(1) for seqs, _ in outs}) >= 4
    *_, args_list, outs, _, _ = _runs("greedy_nmt")
    for ys in outs:
        ended = (ys == 2).cumsum(1) > 0
        assert (ys[:, 1:][ended[:, :-1]] == 0).all(), "tokens after <eos> must be padding"
    assert len({ys.size(1) for ys in outs}) >= 4
    *_, args_list, outs, _, _ = _runs("captioning_teacher")
    for (_, captions, lengths), (preds, sorted_caps, decode_lengths, _, sort_ind) in zip(args_list, outs):
        assert decode_lengths == sorted((lengths[:, 0] - 1).tolist(), reverse=True)
        assert preds.shape == (4, max(decode_lengths), 20) and torch.equal(sorted_caps, captions[sort_ind])
        for row, n in enumerate(decode_lengths):
            assert (preds[row, n:] == 0).all(), "positions past a caption's length stay zero"


def test_shape_branch_shapes():
    *_, outs, _, paths = _runs("shape_branch")
    assert {(path, tuple(out.shape)) for out, path in zip(outs, paths)} == {
        ((("big",),), (1, 10)), ((("small",),), (1, 4))}
