"""Capture of rewritten models (loops, submodules, helpers, expressions): parity and decisions."""
from __future__ import annotations

import warnings

import pytest
import torch

import rewrite_models as M
from dycl_jax.rewrite.api import rewritten, run_torch_trace
from dycl_jax.source import origins
from test_rewrite_capture import check_model

warnings.filterwarnings("ignore", category=FutureWarning)


def test_halting_while_with_python_counter():
    m = M.Halting()
    inputs = check_model(m, {M.site("while", "while (halting < 1 - self.eps)"): {True, False}})
    assert len({int(m(x)[1]) for x in inputs.values()}) >= 2  # different numbers of steps
    ep = M.export_rewritten(m.eval(), next(iter(inputs.values())))
    assert any(n.target is torch.ops.higher_order.while_loop for n in ep.graph.nodes)


def test_dynamic_if_inside_dynamic_while():
    check_model(M.IfInWhile(), {M.site("while", "while h.norm()"): {True, False},
                                M.site("if", "if h.sum() > 0:"): {True, False}})


def test_submodule_forward_with_dynamic_if():
    m = M.Stack()
    check_model(m, {M.site("if", "if x.abs().mean() > 0.5:"): {True, False}})
    with rewritten(m) as record:
        names = {f.name for f in record.functions}
        patched = [p for f in record.functions for p in f.patched]
    assert names == {"Block.forward"} and sorted(patched) == ["forward on blocks.0", "forward on blocks.1"]
    assert "forward" not in m.blocks[0].__dict__  # restored


def test_helper_method_and_function():
    m = M.Helpers()
    check_model(m, {M.site("if", "if (x @ w).sum() > 0:"): {True, False}, M.site("if", "if x.max() > 1.0:"): {True, False}})
    with rewritten(m) as record:
        assert {f.name for f in record.functions} == {"Helpers.route", "Helpers.forward", "gate_fn"}


def test_ternary_and_logical_ops():
    check_model(M.Ternary(), {M.site("ifexp", "y = self.a(x) if"): {True, False},
                              M.site("if", "if (y.mean() > 0"): {True, False}})


def test_method_replaced_in_init():
    m = M.Replaced()
    check_model(m, {M.site("if", "if x.sum() > 0:", "def fast"): {True, False}})
    with rewritten(m) as record:
        assert [f.name for f in record.functions] == ["Replaced.fast"]
    assert m.__dict__["forward"].__func__ is M.Replaced.fast  # the instance's own binding is back


def test_super_call_in_branch():
    check_model(M.Derived(), {M.site("if", "if x.mean() > 0:", "class Derived"): {True, False}})


def test_side_effects_dropped_with_warning():
    m = M.SideEffects().eval()
    line = M.line_of('print("positive"')
    with pytest.warns(UserWarning, match=rf"rewrite_models\.py:{line}: dropped `print\('positive', y\.sum\(\)\)`"):
        with rewritten(m) as record:
            pass
    messages = record.functions[0].warnings
    assert any(f"rewrite_models.py:{M.line_of('self.saved.append(y)')}: dropped `self.saved.append(y)`" in w
               for w in messages)
    assert any(f"rewrite_models.py:{M.line_of('self.calls += 1')}: dropped `self.calls += 1`" in w for w in messages)
    assert any("log.info" in w for w in messages)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_model(m, {M.site("if", "if y.sum() > 0:", "class SideEffects"): {True, False}})
        m.saved.clear()
        run_torch_trace(m, "forward", (torch.ones(3, 4),))
    assert m.saved == []  # the rewritten code does not append (documented choice)


def test_generated_lines_map_to_user_lines():
    m = M.EarlyExit().eval()
    x = torch.randn(3, 4)
    ep = M.export_rewritten(m, x)
    found = {}
    for gm in [ep.graph_module] + [mod for mod in ep.graph_module.modules() if isinstance(mod, torch.fx.GraphModule)]:
        for n in gm.graph.nodes:
            trace = n.meta.get("stack_trace") or ""
            for frame in M._FRAME.finditer(trace):
                if frame["file"].startswith("<dycl-rewrite"):
                    loc = origins.resolve(frame["file"], int(frame["line"]))
                    assert loc is not None and loc.file.endswith("rewrite_models.py")
                    found[loc.line] = loc.code.strip()
    assert found[M.line_of("if conf > self.thr:")] == "if conf > self.thr:"  # the cond node's frame
    assert found[M.line_of("conf = out.softmax")] == "conf = out.softmax(-1).max()"  # an op in a branch
