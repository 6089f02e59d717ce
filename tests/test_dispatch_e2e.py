"""Dispatch host: every example converts and matches the ORIGINAL torch model on every path."""
from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

import dycl_jax
from dycl_jax.errors import DyclError
from dycl_jax.host.dispatch import Compiled
from dycl_jax.rewrite.api import run_dispatch_trace
from examples.dynn import BOUNDED_MODELS, DISPATCH_MODELS, MODELS, PADDED_MODELS, load, seeded
import converted  # tests/: the example conversions this process made already
from differential import assert_same  # pytest puts tests/ on sys.path
from gradient_parity import fewest_covering

N_INPUTS = 50
# every input of these makes new region signatures (a capture and two compiles each): the fewest
# of the N_INPUTS that take every path, rather than all of them (captioning_teacher: one per
# decode length, 7 of 50; moe: 3 of 50, each routing its own token counts, that leave every
# expert empty once and use all experts once)
ONE_PER_PATH = {"captioning_teacher", "moe"}


@lru_cache(maxsize=None)
def _inputs(name: str) -> list[tuple]:
    mod = load(name)
    if name not in ONE_PER_PATH:
        return mod.inputs(N_INPUTS)
    model, _ = mod.example()
    return fewest_covering(mod, model, mod.inputs(N_INPUTS))


@lru_cache(maxsize=None)
def _converted(name: str, host: str):
    if host == "auto":  # the default conversion: shared with the other files that check this example
        return converted.default(name)
    model, args = load(name).example()
    return model, dycl_jax.to_jax(model, args, host=host)


def _leaves(out) -> tuple[list, object]:
    # numpy scalars and 0-d arrays from either side compare as values
    return pytree.tree_flatten(out)




def _check_every_path(name: str, host: str) -> None:
    mod = load(name)
    model, jm = _converted(name, host)
    # decisions of the method itself: a callee's own decisions are made inside a compiled
    # region (a staged island) by the JAX host but in Python by the torch run
    top = {site.label for site in jm._fn.plan.record.functions[0].sites}
    paths: set = set()
    seen: dict[str, set] = defaultdict(set)
    for k, args in enumerate(_inputs(name)):
        with torch.no_grad():
            original = model(*args)
        got, decisions = jm.trace(*args)
        assert_same(original, got, f"{name} input {k} ({host} jm.trace vs original torch)")
        assert_same(original, jm(*args), f"{name} input {k} ({host} jm(...) vs original torch)")
        if k < 5:  # the dispatch program run in torch decides exactly as the JAX host does
            rewritten_out, torch_decisions = run_dispatch_trace(model, "forward", args, jm._fn.failed_islands(),
                                                                 jm._fn.alias_choices)
            assert_same(original, rewritten_out, f"{name} input {k} (dispatch rewrite in torch vs original)")
            mine = [d for d in decisions if d[0] in top]
            assert mine == [d for d in torch_decisions if d[0] in top], f"{name} input {k}: host decisions differ"
        paths.update(mod.path_of(model, args))
        for site, value in decisions:
            seen[site].add(value)
    assert paths == set(mod.PATHS), f"paths never taken: {set(mod.PATHS) - paths}"
    assert jm.report().compilations >= 1


@pytest.mark.parametrize("name", [n for n in DISPATCH_MODELS if n not in PADDED_MODELS])
def test_auto_dispatches_and_matches_torch(name: str) -> None:
    model, jm = _converted(name, "auto")
    assert jm.host == "dispatch"
    reason = jm.report().dispatch_reason
    assert f"{name}.py:" in reason, reason  # names the user's construct that needs dispatch
    _check_every_path(name, "auto")
    if name == "captioning_teacher":
        _check_step_index_is_symbolic(jm)


def _check_step_index_is_symbolic(jm) -> None:
    """The decode step `t` only indexes (`embeddings[:n, t]`, `predictions[:n, t] = ...`): the
    loop body compiles once per shape signature, not once per value of `t`."""
    shapes = set()  # (longest length, rows decoded at t, rows of h before the step) met by the inputs
    for _, _, lengths in _inputs("captioning_teacher"):  # the inputs the host ran
        decode = sorted((lengths.squeeze(1) - 1).tolist(), reverse=True)
        rows = len(decode)
        for t in range(max(decode)):
            n = sum(l > t for l in decode)
            shapes.add((max(decode), n, rows))
            rows = n
    loop = [p for st in jm._fn.regions.values() for p in st.parts if "t" in p.ins and "h" in p.ins]
    assert len(loop) == 1, [p.ins for p in loop]
    compiled = [e for e in loop[0].cache.values() if isinstance(e, Compiled)]
    t_leaf = loop[0].ins.index("t")  # one leaf per name before it (arrays, ints, the module)
    assert sum(t_leaf in e.symbolic for e in compiled) >= len(compiled) // 2, "t is still a compile-time constant"
    assert len(compiled) <= len(shapes), (len(compiled), len(shapes))


@pytest.mark.parametrize("name", MODELS + BOUNDED_MODELS)
def test_staged_examples_under_dispatch(name: str) -> None:
    _check_every_path(name, "dispatch")


@pytest.mark.parametrize("name", PADDED_MODELS)
def test_padded_examples_under_dispatch(name: str) -> None:
    # auto stages these as one padded program (test_auto_padded.py); the dispatch host runs
    # them exactly too
    _check_every_path(name, "dispatch")


@pytest.mark.parametrize("name", ["captioning", "shape_branch"])
def test_second_call_compiles_nothing(name: str) -> None:
    mod = load(name)
    _, jm = _converted(name, "dispatch")
    args = mod.inputs(3)[2]
    jm(*args)
    report = jm.report()
    jm(*args)
    again = jm.report()
    assert (again.captures, again.compilations) == (report.captures, report.compilations)


@pytest.mark.parametrize("name", ["captioning_teacher"])  # and tests/test_staged_host_values.py
def test_staged_refuses_with_location_and_fix(name: str) -> None:
    model, args = load(name).example()
    with pytest.raises(DyclError) as info:
        dycl_jax.to_jax(model, args, host="staged")
    err = info.value
    assert err.location is not None and err.location.file.endswith(f"{name}.py"), err
    assert 'host="auto"' in (err.fix or "") and 'host="dispatch"' in (err.fix or "")
    assert "GuardOnDataDependentSymNode" not in str(err)


class _ReturnsSkipLog(load("skip_logging").GatedResNet):
    """skip_logging whose skip log is returned: kept as a Python list, so the host runs each block."""

    def forward(self, x):
        x = self.stem(x)
        skipped = []
        for t, block in enumerate(self.blocks):
            if self.gates[t](x).item() > 0.5:
                x = block(x)
            else:
                skipped.append(t)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1)), skipped


def test_identical_blocks_share_one_executable() -> None:
    mod = load("skip_logging")
    with seeded(26):  # the example's init: every gate opens for some inputs
        model = _ReturnsSkipLog(num_blocks=mod.NUM_BLOCKS).eval()
    inputs = mod.inputs(10)
    jm = dycl_jax.to_jax(model, inputs[0], host="dispatch")
    for k, args in enumerate(inputs):
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*args), f"input {k}")
    host = jm._fn
    compiled = [e for st in host.regions.values() for p in st.parts for e in p.cache.values() if isinstance(e, Compiled)]
    # four blocks of one architecture: four captured signatures, fewer distinct programs
    assert len(compiled) >= 4, len(compiled)
    assert len(host.executables) < len(compiled), (len(host.executables), len(compiled))
    assert jm.report().compilations < len(compiled)
