"""Analysis: reads/writes, CFG liveness, and which predicates are provably static."""
from __future__ import annotations

import ast
import textwrap

import pytest

from dycl_jax.analysis.cfg import Liveness
from dycl_jax.analysis.dynamism import constructs, is_static, needs_rewrite
from dycl_jax.analysis.scopes import access, block_access, free_names, function_locals


def fn(src: str) -> ast.FunctionDef:
    return ast.parse(textwrap.dedent(src)).body[0]


def stmt(src: str) -> ast.stmt:
    return ast.parse(src).body[0]


@pytest.mark.parametrize("src, reads, binds, mutates", [
    ("y = x + z", {"x", "z"}, {"y"}, set()),
    ("x += 1", {"x"}, {"x"}, {"x"}),
    ("x[i] = v", {"x", "i", "v"}, set(), {"x"}),
    ("self.count = n", {"self", "n"}, set(), {"self"}),
    ("h.add_(1)", {"h"}, set(), {"h"}),
    ("outs.append(y)", {"outs", "y"}, set(), {"outs"}),
    ("self.saved.append(y)", {"self", "y"}, set(), set()),
    ("a, (b, c) = t", {"t"}, {"a", "b", "c"}, set()),
    ("ys = [f(v) for v in xs if v > k]", {"f", "xs", "k"}, {"ys"}, set()),
    ("g = lambda u: u * w", {"w"}, {"g"}, set()),
    ("import torch.nn as tnn", set(), {"tnn"}, set()),
    ("with ctx() as c: pass", {"ctx"}, {"c"}, set()),
])
def test_access(src, reads, binds, mutates):
    acc = access(stmt(src))
    assert (acc.reads, acc.binds, acc.mutates) == (reads, binds, mutates)


def test_nested_def_reads_its_free_names_and_binds_its_name():
    f = fn("""
        def outer(x):
            def inner(y):
                return y + x + scale
            return inner
    """)
    acc = access(f.body[0])
    assert acc.binds == {"inner"} and acc.reads == {"x", "scale"}
    assert free_names(f.body[0]) == {"x", "scale"}
    assert block_access(f.body).reads == {"x", "scale", "inner"}


def test_function_locals_follow_python_rules():
    f = fn("""
        def f(a, *args, b=1, **kw):
            global g
            g = 1
            for i in range(3):
                c = i
            try:
                pass
            except Exception as e:
                pass
    """)
    assert function_locals(f) == {"a", "args", "b", "kw", "i", "c", "e"}


def test_liveness_after_if_and_at_branch_entry():
    f = fn("""
        def f(x, c):
            y = x + 1
            unused = 2
            if c:
                z = y * 2
                w = 3
            else:
                z = y
            t = 5
            return z
    """)
    live = Liveness(f)
    if_stmt = f.body[2]
    assert live.after(if_stmt) == {"z"}
    assert live.entry(if_stmt.body) == {"y"} and live.entry(if_stmt.orelse) == {"y"}


def test_liveness_of_loops_header_break_and_continue():
    f = fn("""
        def g(x, m):
            n = 0
            s = 0
            last = 0
            while n < 3:
                tmp = x * n
                if tmp > m:
                    last = tmp
                    break
                s = s + tmp
                n += 1
            return s + last
    """)
    live = Liveness(f)
    loop = f.body[3]
    assert live.header(loop) == {"n", "s", "x", "m", "last"}
    assert live.after(loop) == {"s", "last"}
    assert live.after(loop.body[1]) == {"s", "tmp", "n", "x", "m", "last"}


def test_liveness_through_try_and_closures():
    f = fn("""
        def h(x):
            a = 1
            try:
                b = x.foo()
            except Exception:
                b = a
            cb = lambda: b
            return cb
    """)
    live = Liveness(f)
    assert "a" in live.entry(f.body[1].body)  # the handler may run after any statement of the body
    assert live.after(f.body[1]) == {"b"}


@pytest.mark.parametrize("src, static", [
    ("x is None", True), ("self.training", True), ("x.shape[-1] > 32", True), ("x.dim() == 4", True),
    ("isinstance(x, list) and len(x) > 2", True), ("not self.training", True), ("3 > 2", True),
    ("x.sum() > 0", False), ("flag", False), ("x.item() > 0.5", False), ("n < self.max_steps", False),
    ("(halting < 1).any() and n < 5", False),
])
def test_static_predicates(src, static):
    assert is_static(ast.parse(src, mode="eval").body) is static


def test_shadowed_builtins_are_not_static():
    assert not is_static(ast.parse("len(x) > 2", mode="eval").body, shadowed={"len"})


def test_what_needs_rewriting():
    assert not needs_rewrite(fn("""
        def f(self, x):
            if self.training:
                x = x * 2
            if x.dim() == 3:
                x = x.flatten(1)
            for blk in self.blocks:
                x = blk(x)
            return x
    """))
    assert needs_rewrite(fn("""
        def f(self, x):
            if x.sum() > 0:
                x = -x
            return x
    """))
    early = fn("""
        def f(self, x):
            for blk in self.blocks:
                x = blk(x)
                if self.done(x):
                    break
            return x
    """)
    assert needs_rewrite(early)
    assert {c.kind for c in constructs(early)} == {"if", "loop-exit"}
    assert needs_rewrite(fn("""
        def f(x):
            def inner(y):
                return y if y.sum() > 0 else -y
            return inner(x)
    """))
