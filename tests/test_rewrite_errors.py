"""Located errors: variables defined on one path, None vs tensor, shape mismatch, unreadable source."""
from __future__ import annotations

import importlib
import sys
import textwrap
import warnings

import pytest
import torch

import rewrite_models as M
from dycl_jax.errors import DyclError
from dycl_jax.rewrite.api import rewritten, run_torch_trace

warnings.filterwarnings("ignore", category=FutureWarning)
X = torch.randn(3, 4)


def export_error(model: torch.nn.Module) -> DyclError:
    with pytest.raises(DyclError) as info:
        M.export_rewritten(model.eval(), X)
    return info.value


def test_variable_defined_on_one_path_and_used_after():
    err = export_error(M.OnePath())
    line = M.line_of("if x.sum() > 0:", "class OnePath")
    assert err.location.file.endswith("rewrite_models.py") and err.location.line == line
    assert err.location.code.strip() == "if x.sum() > 0:"
    assert str(err).startswith(
        f"the `if` at rewrite_models.py:{line}: variable 'y' is assigned on the true branch "
        f"(rewrite_models.py:{line + 1}) but not on the false branch, and it is used afterwards")
    assert "assign 'y' before the if" in err.fix and "y = torch.zeros(...)" in err.fix
    with pytest.raises(DyclError, match=r"variable 'y' is assigned on the true branch"):
        run_torch_trace(M.OnePath(), "forward", (X.abs(),))  # the eager trace mirrors staging


def test_name_defined_on_one_path_but_dead_is_fine():
    m = M.DeadOnePath().eval()
    ep = M.export_rewritten(m, X)
    for x in (X.abs(), -X.abs()):
        assert torch.equal(ep.module()(x), m(x))


def test_none_vs_tensor():
    err = export_error(M.NoneVsTensor())
    line = M.line_of("if x.sum() > 0:", "class NoneVsTensor")
    assert err.location.line == line
    assert (f"variable 'best' is None on the false branch (unchanged there) but a float32[3, 4] tensor on the "
            f"true branch (rewrite_models.py:{line + 1})") in err.message
    assert err.fix.startswith("initialise 'best' with a tensor")


def test_branch_outputs_differ_in_shape_name_both_lines():
    err = export_error(M.ShapeMismatch())
    line = M.line_of("if x.sum() > 0:", "class ShapeMismatch")
    assert (f"variable 'y' is a float32[3, 2] tensor on the true branch (rewrite_models.py:{line + 1}) but a "
            f"float32[3, 4] tensor on the false branch (rewrite_models.py:{line + 3})") in err.message
    assert "same shape and dtype" in err.fix


def test_exec_defined_class_is_refused_with_a_location():
    ns: dict = {"torch": torch}
    exec(textwrap.dedent("""
        class Dyn(torch.nn.Module):
            def forward(self, x):
                if x.sum() > 0:
                    x = x * 2
                return x
        """), ns)
    with pytest.raises(DyclError) as info:
        with rewritten(ns["Dyn"]()):
            pass
    err = info.value
    assert err.message.startswith("cannot read the source of Dyn.forward")
    assert (err.location.file, err.location.line) == ("<string>", 3)
    assert "move the class (or function) into a .py file" in err.fix


def test_stale_source_is_detected(tmp_path, monkeypatch):
    path = tmp_path / "stale_model.py"
    path.write_text(textwrap.dedent("""
        import torch

        class Stale(torch.nn.Module):
            def forward(self, x):
                if x.sum() > 0:
                    x = x * 2
                return x
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("stale_model")
    try:
        path.write_text(path.read_text().replace("x * 2", "x * 3"))
        import linecache

        linecache.checkcache(str(path))
        with pytest.raises(DyclError, match=r"does not match the code Python is running") as info:
            with rewritten(module.Stale()):
                pass
        assert info.value.location.line == 5 and "re-import" in info.value.fix
    finally:
        sys.modules.pop("stale_model", None)


def test_shape_change_live_after_break_is_refused():
    """Placeholders stand in only for values dead after the exit: `x` is returned."""
    err = export_error(M.BreakLiveReshape())
    assert err.location.file.endswith("rewrite_models.py")
    assert err.location.line == M.line_of("for blk in self.blocks:", "class BreakLiveReshape")
    assert "variable 'x' is a float32[3, 8] tensor" in str(err) and "float32[3, 6] tensor" in str(err)
    assert "same shape" in err.fix


def test_list_of_different_shapes_indexed_by_a_tensor():
    err = export_error(M.RaggedPick())
    assert err.location.line == M.line_of("return parts[k]", "class RaggedPick")
    assert "list elements are a float32[3, 4] tensor and a float32[3, 2] tensor" in str(err)
    assert "one shape and dtype" in err.fix
