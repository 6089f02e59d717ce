"""Emitted Flax NNX source: imported where torch cannot be, loaded, and compared on every input
with the original torch model and with `jm`; its size against the 3x budget; its refusals."""
from __future__ import annotations

import importlib
import importlib.util
import inspect

import numpy as np
import pytest
import torch

from emit_jobs import run_emitted  # tests/: one torch-free subprocess for every module
import converted  # tests/: the example conversions this process made already
import dycl_jax
from dycl_jax.errors import DyclError

# (example module, inputs(n) argument): static examples (a ResNet, GRU cells, an LSTM, a MobileNet with
# bilinear upsampling and GroupNorm, a VGG and a WideResNet with ceil-mode, padded and non-divisible
# pooling, a Transformer encoder-decoder with batch-sized expands and layers fed batch-sized views) and every
# staged DyNN example (blockdrop110, blockdrop's 110-layer form, is left to test_dynn_e2e: its conversion
# alone is ~10 CPU-s)
CASES = [("examples.resnet_small", 3), ("examples.gru_cells", 3), ("examples.lstm_classifier", 3),
         ("examples.mobilenet_small", 3), ("examples.vgg_small", 3), ("examples.wide_resnet_small", 3),
         ("examples.transformer_seq2seq", 3),
         ("examples.dynn.shallow_deep", 12), ("examples.dynn.skipnet_ff", 8),
         ("examples.dynn.blockdrop", 8)] + [(f"examples.dynn.{name}", 8) for name in (
             "act", "anytime_msdnet", "deebert", "energy_selector", "nested_while_if", "pabee", "sdn_published",
             "skipnet_rnn", "while_modulelist")]
# ResNet-style: <= 3x
BUDGET = {"examples.resnet_small", "examples.wide_resnet_small", "examples.dynn.skipnet_ff", "examples.dynn.blockdrop"}
EAGER = "examples.resnet_small"  # also called eagerly: an eager lax.cond compiles per call, so jitted elsewhere
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


def _convert(name: str) -> tuple:
    """(model, jm): the default conversion, shared with the other files for the DyNN examples."""
    if name.startswith("examples.dynn."):
        return converted.default(name.rsplit(".", 1)[1])
    model, args = importlib.import_module(name).example()
    return model, dycl_jax.to_jax(model, args if isinstance(args, tuple) else (args,))


@pytest.fixture(scope="module")
def emitted(tmp_path_factory) -> dict:
    """name -> (model, jm, out dir, inputs, what the torch-free runner returned), or the exception
    converting or emitting that case raised: every case is emitted, then ONE subprocess (one
    jax import) loads and runs them all."""
    root = tmp_path_factory.mktemp("emitted")
    made: dict = {}
    jobs: dict = {}
    for name, n in CASES:
        try:
            model, jm = _convert(name)
            jm.emit(str(root / name / "out"))
        except Exception as exc:  # noqa: BLE001  (raised again by this case's test only)
            made[name] = exc
            continue
        cases = _cases(importlib.import_module(name), n)
        made[name] = (model, jm, root / name / "out", cases)
        jobs[name] = (str(root / name / "out"), [tuple(a.numpy() for a in c) for c in cases], name == EAGER)
    results = run_emitted(root, jobs)
    return {name: made[name] if isinstance(made[name], Exception) else made[name] + (results[name],)
            for name in made}


def _same(want: np.ndarray, got: np.ndarray, what: str) -> None:
    assert want.shape == got.shape, what
    if np.issubdtype(want.dtype, np.floating):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=ATOL, err_msg=what)
    else:
        np.testing.assert_array_equal(got.astype(np.int64), want.astype(np.int64), err_msg=what)


@pytest.mark.parametrize("name", [name for name, _ in CASES])
def test_emitted_module_matches_torch_and_jm(name: str, emitted: dict) -> None:
    if isinstance(emitted[name], Exception):
        raise emitted[name]
    model, jm, out, cases, (status, emitted_outs) = emitted[name]
    assert status == "ok", f"{name}: the emitted module failed without torch:\n{emitted_outs}"
    mod = importlib.import_module(name)
    assert (out / "model.safetensors").exists()
    text = (out / "model.py").read_text()
    assert text == jm.to_source()
    imports = [ln.split()[1] for ln in text.splitlines() if ln.startswith(("import ", "from "))]
    assert {i.split(".")[0] for i in imports} <= {"os", "jax", "numpy", "safetensors", "flax"}, imports
    if name in BUDGET:  # size: at most 3x the lines of the torch model's own classes
        assert len(text.splitlines()) <= 3 * _definition_lines(model), (name, len(text.splitlines()))
    eager = name == EAGER
    paths = set()
    assert len(emitted_outs) == len(cases) + eager
    for k, (case, got) in enumerate(zip(cases, emitted_outs)):
        compare(name, k, model, jm, case, got)
        if hasattr(mod, "path_of"):
            paths.add(mod.path_of(model, case))
    if eager:
        with torch.no_grad():
            for w, o in zip(_leaves(model(*cases[0])), _leaves_jax(emitted_outs[-1])):  # the direct call, numpy in
                _same(w, np.asarray(o), f"{name} eager call")
    if hasattr(mod, "path_of"):
        assert len(paths) >= 2, f"{name}: the inputs exercise only one path"


def compare(name: str, k: int, model, jm, case: tuple, got) -> None:
    """One input: the emitted module's outputs against the original torch model's and jm's."""
    with torch.no_grad():
        want = _leaves(model(*case))
    mine, ours = _leaves(jm(*case)), [np.asarray(x) for x in _leaves_jax(got)]
    assert len(want) == len(mine) == len(ours), (name, k)
    for j, (w, m, o) in enumerate(zip(want, mine, ours)):
        _same(w, o, f"{name} case {k} output {j} vs torch")
        _same(np.asarray(m), o, f"{name} case {k} output {j} vs jm")


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


def test_dispatch_host_region_without_emission_rule_is_a_located_error() -> None:
    jm = dycl_jax.to_jax(_Cumulative(), torch.ones(2, 3), host="dispatch")
    assert jm.host == "dispatch"
    with pytest.raises(DyclError) as err:
        jm.emit("/nonexistent/never-written")
    assert "cumsum" in str(err.value) and "test_emit.py" in str(err.value)


class ScalarBuffer(torch.nn.Module):
    """A 0-d buffer and a 0-d tensor constant, read in a tensor branch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.tensor(2.5))

    def forward(self, x):
        h = self.fc(x) * self.scale
        if h.sum() > 0:
            return h + torch.tensor(1.0)
        return h - 1


def test_emitted_weights_keep_zero_dimensional_buffers(tmp_path) -> None:
    # (np.ascontiguousarray wrote them 1-d, and the emitted load() refused them)
    torch.manual_seed(0)
    model = ScalarBuffer().eval()
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    jm = dycl_jax.to_jax(model, (x,), host="staged")
    spec = importlib.util.spec_from_file_location("emitted_scalar_buffer", jm.emit(str(tmp_path / "m")))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    emitted = module.load()
    for k, v in enumerate((x, -x * 3)):
        with torch.no_grad():
            want = model(v).numpy()
        np.testing.assert_allclose(np.asarray(emitted(v.numpy())), want, rtol=1e-6, atol=1e-6, err_msg=f"input {k}")
