"""Source stage: reading and verifying sources, finding what to rewrite, the origin map."""
from __future__ import annotations

import ast
import copy
import functools
import linecache
import warnings

import pytest
import torch

import rewrite_models as M
from dycl_jax.errors import DyclError
from dycl_jax.rewrite.api import rewritten
from dycl_jax.source import origins
from dycl_jax.source.discover import discover, has_branching, is_library
from dycl_jax.source.reader import read_function, verify

warnings.filterwarnings("ignore", category=UserWarning)


def _deco(f):
    @functools.wraps(f)
    def wrapper(*args):
        return f(*args)
    return wrapper


def make_nested(k):
    class Nested(M.Base):
        def __init__(self):
            super().__init__()
            self.__scale = k

        @_deco
        def forward(self, x):
            if x.sum() > k:
                return super().forward(x) * self.__scale
            return x
    return Nested


def test_file_line_numbers_and_class():
    src = read_function(M.Block.forward)
    assert src.file.endswith("rewrite_models.py") and src.class_name == "Block"
    assert src.line == M.line_of("def forward", "class Block(")
    assert src.tree.body[0].lineno == M.line_of("if x.abs().mean() > 0.5:")
    assert src.location(src.tree.body[0].lineno).code.strip() == "if x.abs().mean() > 0.5:"
    helper = read_function(M.gate_fn)
    assert helper.class_name is None and helper.line == M.line_of("def gate_fn")


def test_closure_super_mangling_and_decorator_verify():
    cls = make_nested(2.0)
    src = read_function(cls.forward)  # recompiled with closure, class and imports: matches
    assert src.class_name == "Nested" and src.dropped_decorators == [src.line - 1]
    x = torch.ones(2, 4)
    assert torch.equal(M.export_rewritten(cls().eval(), x).module()(x), cls()(x))


def test_verification_rejects_text_that_is_not_the_running_code():
    src = read_function(M.Block.forward)
    changed = copy.deepcopy(src)
    changed.tree.body[0].test.comparators[0] = ast.Constant(value=0.6)  # a different constant
    with pytest.raises(DyclError, match="does not match the code Python is running"):
        verify(changed)
    shifted = copy.deepcopy(src)
    ast.increment_lineno(shifted.tree, 1)  # same code, other lines
    with pytest.raises(DyclError):
        verify(shifted)


def test_lambdas_are_not_rewritten():
    with pytest.raises(DyclError, match="is a lambda"):
        read_function(lambda x: x if x else -x)


def test_discover_submodules_helpers_and_replaced_methods():
    targets, helpers = discover(M.Stack(), "forward")
    assert sorted(t.label for t in targets) == ["Block.forward", "Block.forward", "Stack.forward"]
    targets, helpers = discover(M.Helpers(), "forward")
    assert sorted(t.label for t in targets) == ["Helpers.forward", "Helpers.route"]
    assert [h.fn for h in helpers] == [M.gate_fn]
    m = M.Replaced()
    (target,) = [t for t in discover(m, "forward")[0] if t.attr == "forward"]
    assert target.fn is M.Replaced.fast and target.bound is m and target.binding == "method"


def test_library_code_is_never_a_target():
    assert is_library(torch.nn.Linear.forward) and is_library(torch.nn.LSTM.forward)
    assert not is_library(M.Block.forward)
    targets, _ = discover(torch.nn.Sequential(torch.nn.Linear(4, 4), M.Block(1)), "forward")
    assert [t.label for t in targets] == ["Block.forward"]


def test_has_branching_looks_at_bytecode():
    assert has_branching(M.Block.forward.__code__) and has_branching(M.Ternary.forward.__code__)
    assert not has_branching(M.Wrap.forward.__code__)


def test_origin_map_and_linecache():
    with rewritten(M.Stack()) as record:
        (fn,) = record.functions
    lines = linecache.getlines(fn.generated)
    assert fn.generated.startswith("<dycl-rewrite:Block.forward") and lines
    user_if = M.line_of("if x.abs().mean() > 0.5:")
    calls = [i for i, text in enumerate(lines, 1) if "_dycl_ops.cond(" in text]
    sites = [origins.site(fn.generated, i) for i in calls]
    # one cond: `return x * 2` (after the early return) moves into the `if`'s else branch
    assert sites == [f"if@rewrite_models.py:{user_if}"]
    loc = origins.resolve(fn.generated, calls[0])
    assert loc.file.endswith("rewrite_models.py") and loc.line == user_if
    body = [i for i, text in enumerate(lines, 1) if "torch.relu(self.lin(x))" in text]
    assert origins.resolve(fn.generated, body[0]).line == user_if + 1
    assert origins.site(fn.generated, body[0]) is None
    assert origins.is_decision("if@a.py:1") and not origins.is_decision("guard@a.py:1")


def test_operator_calls_in_expressions_get_their_own_line():
    with rewritten(M.Ternary()) as record:
        (fn,) = record.functions
    lines = linecache.getlines(fn.generated)
    for i, text in enumerate(lines, 1):
        assert text.count("_dycl_ops.ifexp(") + text.count("_dycl_ops.cond(") <= 1
        if "_dycl_ops.ifexp(" in text:
            assert origins.site(fn.generated, i) == M.site("ifexp", "y = self.a(x) if")


def test_unique_filenames():
    a = origins.unique_filename("Same.forward", "text one")
    b = origins.unique_filename("Same.forward", "text two")
    assert a == "<dycl-rewrite:Same.forward>" and b == "<dycl-rewrite:Same.forward#2>"
    assert origins.unique_filename("Same.forward", "text one") == a
