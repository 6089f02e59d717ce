"""Emitted Flax NNX source: imported where torch cannot be, loaded, and compared on every input
with the original torch model and with `jm`; its size against the 3x budget; its refusals."""
from __future__ import annotations

import importlib
import inspect
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import dycl_jax
from dycl_jax.errors import DyclError

RUNNER = Path(__file__).with_name("emit_runner.py")
# (example module, inputs(n) argument): a static ResNet, an early exit, two layer-skipping models
CASES = [("examples.resnet_small", 3), ("examples.dynn.shallow_deep", 12), ("examples.dynn.skipnet_ff", 8),
         ("examples.dynn.blockdrop", 8)]
BUDGET = {"examples.resnet_small", "examples.dynn.skipnet_ff", "examples.dynn.blockdrop"}  # ResNet-style: <= 3x
ATOL = 1e-4  # float32 outputs; integer and boolean outputs (exit ids, masks, policies) exactly


def _cases(mod, n: int) -> list[tuple]:
    got = mod.inputs(n)
    got = got if isinstance(got, list) else [got]
    return [c if isinstance(c, tuple) else (c,) for c in got]


def _leaves(tree) -> list[np.ndarray]:
    if isinstance(tree, torch.Tensor):
        return [tree.detach().numpy()]
    if isinstance(tree, (list, tuple)):
        return [x for t in tree for x in _leaves(t)]
    if isinstance(tree, dict):
        return [x for k in sorted(tree) for x in _leaves(tree[k])]
    return [np.asarray(tree)]


def _run_emitted(out: Path, cases: list[tuple], tmp: Path, eager: bool) -> list:
    with open(tmp / "cases.pkl", "wb") as f:
        pickle.dump([tuple(a.numpy() for a in c) for c in cases], f)
    proc = subprocess.run([sys.executable, str(RUNNER), str(out), str(tmp / "cases.pkl"), str(tmp / "res.pkl"), "eager" if eager else ""],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp / "res.pkl", "rb") as f:
        return pickle.load(f)


def _same(want: np.ndarray, got: np.ndarray, what: str) -> None:
    assert want.shape == got.shape, what
    if np.issubdtype(want.dtype, np.floating):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=ATOL, err_msg=what)
    else:
        np.testing.assert_array_equal(got.astype(np.int64), want.astype(np.int64), err_msg=what)


@pytest.mark.parametrize("name,n", CASES)
def test_emitted_module_matches_torch_and_jm(name: str, n: int, tmp_path: Path) -> None:
    mod = importlib.import_module(name)
    model, args = mod.example()
    jm = dycl_jax.to_jax(model, args if isinstance(args, tuple) else (args,))
    jm.emit(str(tmp_path / "out"))
    assert (tmp_path / "out" / "model.safetensors").exists()
    text = (tmp_path / "out" / "model.py").read_text()
    assert text == jm.to_source()
    imports = [ln.split()[1] for ln in text.splitlines() if ln.startswith(("import ", "from "))]
    assert {i.split(".")[0] for i in imports} <= {"os", "jax", "numpy", "safetensors", "flax"}, imports
    if name in BUDGET:  # size: at most 3x the lines of the torch model's own classes
        assert len(text.splitlines()) <= 3 * _definition_lines(model), (name, len(text.splitlines()))
    cases = _cases(mod, n)
    eager = name == "examples.resnet_small"  # an eager lax.cond compiles per call: jitted elsewhere
    emitted = _run_emitted(tmp_path / "out", cases, tmp_path, eager)
    paths = set()
    for k, (case, got) in enumerate(zip(cases, emitted)):
        with torch.no_grad():
            want = _leaves(model(*case))
        mine, ours = _leaves(jm(*case)), [np.asarray(x) for x in _leaves_jax(got)]
        assert len(want) == len(mine) == len(ours), (name, k)
        for j, (w, m, o) in enumerate(zip(want, mine, ours)):
            _same(w, o, f"{name} case {k} output {j} vs torch")
            _same(np.asarray(m), o, f"{name} case {k} output {j} vs jm")
        if hasattr(mod, "path_of"):
            paths.add(mod.path_of(model, case))
    if eager:
        with torch.no_grad():
            for w, o in zip(_leaves(model(*cases[0])), _leaves_jax(emitted[-1])):  # the direct call, numpy in
                _same(w, np.asarray(o), f"{name} eager call")
    if hasattr(mod, "path_of"):
        assert len(paths) >= 2, f"{name}: the inputs exercise only one path"


def _leaves_jax(tree) -> list:
    if isinstance(tree, (list, tuple)):
        return [x for t in tree for x in _leaves_jax(t)]
    if isinstance(tree, dict):
        return [x for k in sorted(tree) for x in _leaves_jax(tree[k])]
    return [tree]


def _definition_lines(model: torch.nn.Module) -> int:
    """Source lines of the model's own classes (the torch model definition)."""
    classes = {type(m) for m in model.modules() if not type(m).__module__.startswith("torch.")}
    return sum(len(inspect.getsourcelines(c)[0]) for c in classes)


class _Cumulative(torch.nn.Module):
    def forward(self, x):
        return torch.cumsum(x, 1) * 2  # cumsum has a lowering but no emission rule


def test_op_without_emission_rule_is_a_located_error() -> None:
    jm = dycl_jax.to_jax(_Cumulative(), torch.randn(2, 5))
    with pytest.raises(DyclError) as err:
        jm.to_source()
    assert "cumsum" in str(err.value) and "test_emit.py" in str(err.value)


def test_dispatch_host_model_is_refused_with_the_fix() -> None:
    jm = dycl_jax.to_jax(_Cumulative(), torch.ones(2, 3), host="dispatch")
    assert jm.host == "dispatch"
    with pytest.raises(DyclError, match="staged"):
        jm.emit("/nonexistent/never-written")
