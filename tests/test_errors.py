"""User errors at conversion and call time are DyclErrors that say what was expected and given."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import dycl_jax
from dycl_jax.errors import CallError, DyclError


class MatMul(torch.nn.Module):
    """Only aten.mm after export, so these tests do not depend on the wider op coverage."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 3))
        self.w2 = torch.nn.Parameter(torch.randn(4, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, self.w)

    def pick(self, x: torch.Tensor, use_second: bool) -> torch.Tensor:
        # a Python bool argument: static, baked in at conversion
        return torch.mm(x, self.w2 if use_second else self.w)


@pytest.fixture(scope="module")
def model() -> MatMul:
    torch.manual_seed(0)
    return MatMul().eval()


@pytest.fixture(scope="module")
def jm(model: MatMul) -> dycl_jax.JaxModel:
    return dycl_jax.to_jax(model, (torch.randn(3, 4),))


def test_good_call_matches_torch(model, jm):
    # the baseline the error tests below depart from: a different batch size is fine
    x = torch.randn(5, 4)
    np.testing.assert_allclose(np.asarray(jm(x)), model(x).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_float64_numpy_input_is_accepted_and_narrowed(model, jm):
    x = np.random.default_rng(0).standard_normal((2, 4))  # float64, as numpy makes by default
    out = np.asarray(jm(x))
    assert out.dtype == np.float32
    ref = model(torch.from_numpy(x).float()).detach().numpy()
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_too_many_args(jm):
    x = np.zeros((5, 4), np.float32)
    expected = r"(?s)expected arguments \(x: float32\[B, 4\]\).*got \(float32\[5, 4\], float32\[5, 4\]\)"
    with pytest.raises(CallError, match=expected):
        jm(x, x)


def test_missing_arg(jm):
    with pytest.raises(CallError, match=r"(?s)expected arguments \(x: float32\[B, 4\]\).*got \(\)"):
        jm()


def test_wrong_shape(jm):
    with pytest.raises(CallError, match=r"x: expected float32\[B, 4\] \(B = any batch size\), got float32\[5, 3\]"):
        jm(np.zeros((5, 3), np.float32))


def test_wrong_rank(jm):
    with pytest.raises(CallError, match=r"x: expected float32\[B, 4\].*got float32\[4\]"):
        jm(np.zeros((4,), np.float32))


def test_wrong_dtype(jm):
    with pytest.raises(CallError, match=r"x: expected float32\[B, 4\].*got int32\[5, 4\]"):
        jm(np.zeros((5, 4), np.int32))


def test_not_an_array(jm):
    with pytest.raises(CallError, match=r"x: expected an array float32\[B, 4\], got float"):
        jm(3.0)


def test_baked_in_arg_with_another_value(model):
    jp = dycl_jax.to_jax(model, (torch.randn(3, 4), True), method="pick")
    x = torch.randn(2, 4)
    np.testing.assert_allclose(np.asarray(jp(x, True)), model.pick(x, True).detach().numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(CallError, match=r"baked in as True at conversion; got False") as info:
        jp(x, False)
    assert "convert again" in str(info.value)


def test_to_jax_on_a_non_module():
    with pytest.raises(DyclError, match=r"expects a torch\.nn\.Module, got function"):
        dycl_jax.to_jax(lambda x: x, (torch.randn(2, 4),))


def test_unknown_method(model):
    with pytest.raises(DyclError, match=r"MatMul has no method 'predict'") as info:
        dycl_jax.to_jax(model, (torch.randn(2, 4),), method="predict")
    assert info.value.fix and "method=" in info.value.fix


def test_unknown_host(model):
    with pytest.raises(DyclError, match=re.escape("unknown host 'fast'")) as info:
        dycl_jax.to_jax(model, (torch.randn(2, 4),), host="fast")
    assert "staged" in (info.value.fix or "")


def test_an_error_raised_from_none_does_not_chain_its_hidden_context():
    """A KeyError that dycl_jax turns into a DyclError `from None` is not an internal error of
    whatever is raised later while the DyclError is handled (the OpInfo harness converts each
    sample again inside the handler of its batch's failure)."""
    from dycl_jax.errors import exception_chain, raised_by_us

    try:
        try:
            {}["dtype"]
        except KeyError:
            raise DyclError("refused") from None
    except DyclError as refusal:
        assert exception_chain(refusal) == [refusal]
        try:
            raise ValueError("raised while handling it")
        except ValueError as later:
            assert exception_chain(later) == [later, refusal]
    own = KeyError("x")
    try:
        raise own
    except KeyError:
        pass
    assert not raised_by_us(own)  # raised in this test file, not in dycl_jax


@pytest.mark.parametrize("folder", ["dycl_jax", "torch"])
def test_a_user_folder_named_like_a_library_is_still_the_users_line(folder, tmp_path):
    """The user's line of a graph node is the innermost frame outside torch and dycl_jax, told by
    their folders: a model kept under a folder called `dycl_jax` or `torch` is the user's code."""
    from dycl_jax.lower.interpreter import node_location

    user = str(tmp_path / folder / "model.py")
    graph = torch.fx.symbolic_trace(torch.nn.ReLU()).graph
    node = next(n for n in graph.nodes if n.op == "call_function" or n.op == "call_module")
    node.meta["stack_trace"] = (f'  File "{user}", line 12, in forward\n    y = self.act(x)\n'
                                f'  File "{torch.nn.functional.__file__}", line 5, in relu\n    result = ...\n')
    loc = node_location(node)
    assert loc is not None and (loc.file, loc.line) == (user, 12), loc
