"""host="auto" moves to the dispatch host only for the documented reasons: an exception that
dycl_jax's own code raised or provoked during the staged attempt surfaces as itself, with a note
asking to report it, never relabelled as a refusal nor hidden by a quiet move to dispatch."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import dycl_jax
from dycl_jax.errors import DyclError
from dycl_jax.rewrite import operators

X = torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.25, -0.5]])


class UpdatedInABranch(nn.Module):
    """A tensor branch that updates `v` in place: the staged attempt checks its aliases."""

    def forward(self, h):
        v = h * 0.5
        if h.sum() > 0:
            v.add_(1.0)
        return v


def _ours(kind: str):
    """A replacement for an operators function whose code is dycl_jax's (compiled under
    operators.py's file name), raising `kind`: a bug in our own code, as a test can make one."""
    namespace: dict = {}
    exec(compile(f"def broken(*args, **kwargs):\n    raise {kind}('provoked by dycl_jax')\n", operators.__file__,
                 "exec"), namespace)
    return namespace["broken"]


@pytest.mark.parametrize("kind", ["RuntimeError", "KeyError", "ValueError"])
@pytest.mark.parametrize("host", ["auto", "staged"])
def test_an_error_raised_by_our_own_code_during_staging_surfaces_as_itself(monkeypatch, kind, host):
    monkeypatch.setattr(operators, "_check_aliases", _ours(kind))
    with pytest.raises(BaseException) as info:
        dycl_jax.to_jax(UpdatedInABranch().eval(), (X,), host=host)
    assert type(info.value).__name__ == kind and not isinstance(info.value, DyclError), info.value
    assert any("please report it" in n for n in getattr(info.value, "__notes__", [])), info.value


def test_a_torch_error_provoked_by_our_own_call_does_not_move_auto_to_dispatch(monkeypatch):
    # the last stop's bug, re-made: our branch-update check read `_version` of an inference
    # tensor (torch raises RuntimeError there), and auto quietly chose the dispatch host
    monkeypatch.setattr(torch.Tensor, "is_inference", lambda self: False)
    with torch.inference_mode(), pytest.raises(RuntimeError) as info:
        dycl_jax.to_jax(UpdatedInABranch().eval(), (X,))
    assert "Inference tensors" in str(info.value) and not isinstance(info.value, DyclError)


class RaisesInTheUsersCode(nn.Module):
    """A shape error in the user's own code fails under torch too: it is not ours to report."""

    def forward(self, h):
        if h.sum() > 0:
            h = h @ torch.ones(4, 2)
        return h


def test_an_error_in_the_users_code_is_not_called_ours():
    with pytest.raises(Exception) as info:
        dycl_jax.to_jax(RaisesInTheUsersCode().eval(), (X,))
    assert not any("please report it" in n for n in getattr(info.value, "__notes__", [])), info.value


def test_the_functions_that_hand_the_program_to_torch_exist():
    # (named by file and function in errors.HANDS_TO_TORCH: a rename must update it)
    import importlib

    from dycl_jax.errors import HANDS_TO_TORCH
    for file, function in HANDS_TO_TORCH:
        module = importlib.import_module("dycl_jax." + file[:-3].replace("/", "."))
        source = open(module.__file__).read()
        assert f"def {function}(" in source, (file, function)


class BranchesOfDifferentLayout(nn.Module):
    """One path gives a transposed view's layout, the other a contiguous one: torch.cond wants
    the paths' strides equal, so the staged paths return contiguous copies (free in JAX)."""

    def forward(self, h):
        w = (h * 0.5).transpose(0, 1)
        if h.mean() < 0.1:
            out = w * 2.0
        else:
            out = w.contiguous() + 1.0
        return out


def test_branches_of_different_layout_stage():
    model = BranchesOfDifferentLayout().eval()
    jm = dycl_jax.to_jax(model, (X,))
    assert jm.host == "staged"
    for x in (X, -X, X * 3):
        torch.testing.assert_close(torch.as_tensor(np.asarray(jm(x))), model(x), rtol=1e-5, atol=1e-6)
