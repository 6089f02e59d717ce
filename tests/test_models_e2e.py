"""End to end on static example models: to_jax matches torch in outputs (several batch sizes),
under jax.jit of the pure apply, and in parameter gradients."""
from __future__ import annotations

import copy
import importlib
import warnings
from types import ModuleType

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from dycl_jax.convert import to_jax

EXAMPLES = [
    "resnet_small",
    "mobilenet_small",
    "wide_resnet_small",
    "vgg_small",
    "lstm_classifier",
    "gru_cells",
    "transformer_seq2seq",
]
TOL = 1e-4


class Converted:
    """One example: the torch model, its example module, and the converted JaxModel."""

    def __init__(self, name: str):
        self.mod: ModuleType = importlib.import_module(f"examples.{name}")
        self.model, self.args = self.mod.example()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.export's deprecation chatter
            self.jm = to_jax(self.model, self.args)


@pytest.fixture(scope="module", params=EXAMPLES)
def ex(request) -> Converted:
    # module scope + params: pytest runs every test of one example before converting the next
    return Converted(request.param)


def _np(out) -> np.ndarray:
    return np.asarray(out.detach() if isinstance(out, torch.Tensor) else out)


def _torch(model: torch.nn.Module, args: tuple) -> torch.Tensor:
    # eager nn.Transformer takes its nested-tensor fast path and warns that it is a prototype
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*nested tensors is in prototype.*")
        return model(*args)


def test_example_is_small_and_in_eval_mode(ex: Converted) -> None:
    assert not ex.model.training
    assert sum(p.numel() for p in ex.model.parameters()) < 1_000_000
    assert all(a.shape[0] == 2 for a in ex.args)


@pytest.mark.parametrize("batch", [1, 2, 5])
def test_output_matches_torch(ex: Converted, batch: int, record_property) -> None:
    args = ex.mod.inputs(batch, seed=batch)
    with torch.no_grad():
        expected = _np(_torch(ex.model, args))
    got = _np(ex.jm(*args))
    assert got.shape == expected.shape
    record_property("max_abs_diff", float(np.abs(got - expected).max()))
    np.testing.assert_allclose(got, expected, rtol=TOL, atol=TOL)


def test_jit_of_pure_apply_equals_call(ex: Converted) -> None:
    args = tuple(a.numpy() for a in ex.args)
    direct = _np(ex.jm(*args))
    apply = jax.jit(ex.jm.apply)
    jitted = _np(apply(nnx.state(ex.jm.module), *args))
    np.testing.assert_allclose(jitted, direct, rtol=1e-6, atol=1e-6)
    # apply really reads the state it is given: zeroed parameters change the result
    params, rest = nnx.state(ex.jm.module, nnx.Param, ...)
    zeroed = jax.tree.map(lambda v: v * 0, params)
    changed = _np(apply(nnx.merge_state(zeroed, rest), *args))
    assert not np.allclose(changed, direct)


def test_param_gradients_match_torch(ex: Converted) -> None:
    args = ex.args
    with torch.no_grad():
        out_shape = _torch(ex.model, args).shape
    # a fixed random projection of the output as the scalar loss
    proj = torch.randn(out_shape, generator=torch.Generator().manual_seed(7))
    ex.model.zero_grad()
    (_torch(ex.model, args) * proj).sum().backward()
    expected = {name: p.grad.numpy() for name, p in ex.model.named_parameters()}

    params, rest = nnx.state(ex.jm.module, nnx.Param, ...)
    jproj = proj.numpy()
    np_args = tuple(a.numpy() for a in args)

    def loss(p):
        return (ex.jm.apply(nnx.merge_state(p, rest), *np_args) * jproj).sum()

    grads = {".".join(map(str, path)): np.asarray(v.value) for path, v in jax.jit(jax.grad(loss))(params).flat_state()}
    assert set(grads) == set(expected), "the converted state's parameters differ from named_parameters()"
    for name, ref in expected.items():
        np.testing.assert_allclose(grads[name], ref, rtol=TOL, atol=TOL, err_msg=name)


def test_batchnorm_model_in_train_mode_warns_and_converts_in_eval_mode() -> None:
    mod = importlib.import_module("examples.resnet_small")
    model, args = mod.example()
    model.train()
    with torch.no_grad():  # on a copy: a train-mode call would update the running statistics
        train_out = copy.deepcopy(model)(*args).numpy()
    with pytest.warns(UserWarning, match="training mode"):
        jm = to_jax(model, args)
    assert model.training, "conversion must restore the user's mode"
    model.eval()
    with torch.no_grad():
        eval_out = model(*args).numpy()
    got = np.asarray(jm(*args))
    np.testing.assert_allclose(got, eval_out, rtol=TOL, atol=TOL)
    assert not np.allclose(got, train_out, rtol=TOL, atol=TOL)
