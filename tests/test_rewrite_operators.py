"""Runtime operators: Python values run Python; tensors are recorded (tracing) and unified."""
from __future__ import annotations

import pytest
import torch

from dycl_jax.errors import DyclError
from dycl_jax.rewrite import operators as ops
from dycl_jax.rewrite.plan import Undefined, build
from dycl_jax.rewrite.sites import RETVAL, Site

IF = Site("if", "/src/model.py", 12, "if c:", ("a", "b"), ("true branch", "false branch"), ((13, 14), (None, 16)))
ELIF = Site("elif", "/src/model.py", 20, "if p:", ("y",), ("`if` branch", "`elif` branch", "`else` branch"),
            ((21,), (23,), (25,)))
LOOP = Site("while", "/src/model.py", 30, "while t:", ("h", "n"), ("value before the loop", "value after an iteration"),
            ((None, None), (31, 32)))
# Predicates made outside the traced program, like inputs: a `torch.tensor(True)` made while
# tracing is built from constants, and the operators decide it as Python (test_constant_flags.py).
TRUE, FALSE = torch.tensor(True), torch.tensor(False)


def branches():
    calls: list[str] = []
    t = lambda a, b: (calls.append("t"), a + 1, b)[1:]  # noqa: E731
    f = lambda a, b: (calls.append("f"), a - 1, b)[1:]  # noqa: E731
    return calls, t, f


def test_python_predicate_runs_only_the_taken_branch():
    calls, t, f = branches()
    assert ops.cond(True, t, f, (1, 2), IF) == (2, 2) and calls == ["t"]
    assert ops.cond(0, t, f, (1, 2), IF) == (0, 2) and calls == ["t", "f"]


def test_tensor_predicate_in_plain_eager_mode_is_python():
    calls, t, f = branches()
    assert ops.cond(torch.tensor(False), t, f, (1, 2), IF) == (0, 2) and calls == ["f"]


def test_tracing_records_and_gives_the_staged_types():
    calls, t, f = branches()
    with ops.tracing() as decisions:
        a, b = ops.cond(TRUE, t, f, (1, 2), IF)
    assert decisions == [("if@model.py:12", True)]
    assert isinstance(a, torch.Tensor) and a.dtype == torch.int64 and a.item() == 2  # differs per path
    assert b == 2 and not isinstance(b, torch.Tensor)  # the same Python value on both paths


def test_switch_python_prefix_decides_without_a_record():
    fns = [lambda y: (y + 1,), lambda y: (y + 2,), lambda y: (y + 3,)]
    with ops.tracing() as decisions:
        assert ops.switch([lambda: True, lambda: torch.tensor(True)], fns, (0,), ELIF) == (1,)
    assert decisions == []
    with ops.tracing() as decisions:
        (out,) = ops.switch([lambda: False, lambda: FALSE], fns, (0,), ELIF)
    assert decisions == [("elif@model.py:20", 2)] and out.item() == 3


def test_while_loop_records_every_test_and_carries_counters_as_tensors():
    test = lambda h, n, lim: torch.logical_and(h.sum() < lim, torch.as_tensor(n < 5))  # noqa: E731
    body = lambda h, n, lim: (h * 2, n + 1)  # noqa: E731
    h0 = torch.ones(2)
    assert ops.while_loop(test, body, (h0, 0), (10.0,), LOOP)[1] == 3  # plain: a Python int
    with ops.tracing() as decisions:
        h, n = ops.while_loop(test, body, (h0, 0), (10.0,), LOOP)
    assert torch.equal(h, torch.full((2,), 8.0)) and n.dtype == torch.int64 and n.item() == 3
    assert decisions == [("while@model.py:30", True)] * 3 + [("while@model.py:30", False)]


def test_python_while_stays_python():
    with ops.tracing() as decisions:
        assert ops.while_loop(lambda n: n < 3, lambda n: (n + 1,), (0,), (), LOOP) == (3,)
    assert decisions == []


def test_logical_ops_short_circuit_python_values():
    called: list[int] = []
    assert ops.and_(False, lambda: called.append(1)) is False
    assert ops.or_("x", lambda: called.append(1)) == "x"
    assert called == []
    assert ops.and_(torch.tensor(True), lambda: 5) == 5  # plain mode: Python semantics
    assert ops.not_(torch.tensor(False)) is True
    with ops.tracing():
        out = ops.and_(TRUE, lambda: FALSE)
        assert isinstance(out, torch.Tensor) and not out.item()
        assert ops.or_(FALSE, lambda: True) is True  # true whatever the tensor holds: decided as Python
        assert ops.and_(TRUE, lambda: False) is False
        assert isinstance(ops.or_(FALSE, lambda: False), torch.Tensor)
        assert isinstance(ops.not_(torch.tensor(False)), torch.Tensor)


def test_item_and_casts_keep_tensors_when_staged():
    t = torch.tensor([2.7])
    assert (ops.item(t), ops.as_bool(t), ops.as_float(t), ops.as_int(t)) == (pytest.approx(2.7), True, pytest.approx(2.7), 2)
    with ops.tracing():
        kept = [ops.item(t), ops.as_bool(t), ops.as_float(torch.tensor(3)), ops.as_int(t)]
    assert all(isinstance(k, torch.Tensor) and k.dim() == 0 for k in kept)
    assert [k.item() for k in kept] == [pytest.approx(2.7), True, 3.0, 2]


def test_stop_and_own():
    assert ops.stop(False, True) and not ops.stop(torch.tensor(True)) and not ops.stop(False)
    x, y = torch.ones(2), torch.zeros(2)
    assert ops.own((x,))[0] is x
    with ops.tracing():
        a, b, c, xs = ops.own((x, x), (x, [x, y]))  # one copy for every name of x, in lists too
        assert a is not x and a is b is c and xs[0] is a and xs[1] is y


def test_undefined_fails_like_python():
    with pytest.raises(UnboundLocalError, match="'y' referenced before assignment"):
        bool(Undefined("y"))
    with pytest.raises(UnboundLocalError):
        Undefined("y") + 1


def test_plan_promotes_python_numbers_and_keeps_constants():
    x = torch.zeros(2, 3)
    plan = build(IF, [(1, "same"), (2, "same")])
    assert plan.n_tensors == 1 and plan.vars[0].leaves[0].dtype == torch.int64 and plan.vars[1].leaves[0].const
    assert build(IF, [(True, x), (False, x)]).vars[0].leaves[0].dtype == torch.bool
    assert build(IF, [(1, x), (1.5, x)]).vars[0].leaves[0].dtype == torch.float32
    assert build(IF, [(0, x), (torch.tensor(2.0), x)]).vars[0].leaves[0].dtype == torch.float32


def test_plan_placeholder_only_for_the_return_value():
    site = Site("if", "/src/model.py", 5, "if c:", (RETVAL,), ("true branch", "false branch"), ((6,), (None,)))
    plan = build(site, [((torch.ones(2, 3), 4),), (Undefined(RETVAL),)])
    (value,) = plan.rebuild(plan.flatten((Undefined(RETVAL),)))
    assert torch.equal(value[0], torch.zeros(2, 3)) and value[1] == 4  # zeros; the constant kept
    with pytest.raises(DyclError, match=r"variable 'a' is assigned on the true branch \(model\.py:13\) but not on "
                                        r"the false branch, and it is used afterwards"):
        build(IF, [(torch.ones(1), 1), (Undefined("a"), 1)])


def test_plan_errors_name_variable_and_lines():
    with pytest.raises(DyclError, match=r"variable 'a' is None on the false branch \(unchanged there\) but a "
                                        r"float32\[2\] tensor on the true branch \(model\.py:13\)"):
        build(IF, [(torch.ones(2), 0), (None, 0)])
    with pytest.raises(DyclError, match=r"variable 'b' is a float32\[2\] tensor on the true branch \(model\.py:14\) "
                                        r"but a int64\[2\] tensor on the false branch \(model\.py:16\)"):
        build(IF, [(0, torch.ones(2)), (0, torch.ones(2, dtype=torch.int64))])
    with pytest.raises(DyclError, match=r"variable 'a' is tuple of 2 leaves on the true branch .* but tuple of 3"):
        build(IF, [((1, 2), 0), ((1, 2, 3), 0)])
    with pytest.raises(DyclError, match=r"different Python objects cannot be chosen by a tensor condition"):
        build(IF, [("relu", 0), ("gelu", 0)])


def test_condition_must_have_one_element():
    calls, t, f = branches()
    with ops.tracing(), pytest.raises(DyclError, match=r"the condition is a tensor of shape \[2\]") as info:
        ops.cond(torch.tensor([True, False]), t, f, (1, 2), IF)
    assert ".any() or .all()" in info.value.fix and info.value.location.line == 12


GUARD = Site("guard", "/src/model.py", 40, "x = f(x)", ("x", "r"), ("true branch", "false branch"),
             ((41, None), (None, None)), dead_on_exit=("x",))


def test_exit_path_gives_dead_variables_placeholders_of_the_run_path():
    run = lambda x, r: (x[:, :2] * 2, r)  # noqa: E731  (the width changes on the run path)
    skip = lambda x, r: (x, r)  # noqa: E731
    x, r = torch.ones(3, 4), torch.tensor(5.0)
    with ops.tracing():
        out = ops.cond(FALSE, run, skip, (x, r), GUARD)  # exit taken: x is dead
        assert out[0].shape == (3, 2) and not out[0].any() and out[1] == 5.0
        assert torch.equal(ops.cond(TRUE, run, skip, (x, r), GUARD)[0], torch.full((3, 2), 2.0))
    live = Site("guard", "/src/model.py", 40, "x = f(x)", ("x", "r"), ("true branch", "false branch"),
                ((41, None), (None, None)))
    with ops.tracing(), pytest.raises(DyclError, match=r"variable 'x' is a float32\[3, 2\] tensor"):
        ops.cond(FALSE, run, skip, (x, r), live)  # not dead: shapes must agree


def test_unless_tells_exit_only_false_paths():
    flag = torch.tensor(False)
    with ops.tracing():
        assert isinstance(ops.unless((flag,), lambda: True), ops.ExitOnly)  # false only when flag set
        assert ops.unless((flag,), lambda: False) is False  # decided without a graph op
        mixed = ops.unless((flag, False), lambda: TRUE)
        assert isinstance(mixed, torch.Tensor) and bool(mixed)  # false path: flag or test
        assert ops.unless((True, flag), lambda: 1 / 0) is False  # Python short-circuit
    assert ops.unless((torch.tensor(True),), lambda: True) is False  # plain mode: Python truth


def test_host_values_stay_tensors_when_traced():
    import numpy as np

    xs = [torch.tensor(0.2), torch.tensor(0.7), torch.tensor(0.7)]
    assert ops.np_reduce(np.argmax, xs) == 1 and isinstance(ops.np_reduce(np.argmax, xs), np.integer)
    with ops.tracing():
        k = ops.np_reduce(np.argmax, xs)
        assert isinstance(k, torch.Tensor) and int(k) == 1  # first index on ties, like numpy
        rows = [torch.full((2,), float(i)) for i in range(3)]
        assert torch.equal(ops.getitem(rows, k), rows[1]) and torch.equal(ops.getitem(rows, torch.tensor(-1)), rows[2])
        assert ops.getitem([(rows[0], "a"), (rows[2], "a")], torch.tensor(1))[1] == "a"
        assert torch.equal(ops.getitem(rows, torch.tensor(True)), rows[1])  # like Python: True == 1
        with pytest.raises(DyclError, match=r"a ModuleList is indexed by a tensor") as info:
            ops.getitem(torch.nn.ModuleList([torch.nn.ReLU()]), torch.tensor(0))
        assert "Python int" in info.value.fix
        with pytest.raises(DyclError, match=r"list elements are a float32\[2\] tensor and a float32\[3\] tensor"):
            ops.getitem([torch.zeros(2), torch.zeros(3)], torch.tensor(0))
        owned, = ops.own((xs,))
        assert owned == xs and owned is not xs  # a branch appends to its own copy
    assert ops.getitem(rows, 2) is rows[2] and ops.own((xs,))[0] is xs
