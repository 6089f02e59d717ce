"""The dispatch rewrite keeps Python's semantics exactly: original vs rewritten functions run
as plain Python on the same inputs (regions as plain statements, no executor)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dycl_jax.rewrite.api import rewrite_function


def early_return_in_else_chain(x, k):
    if k == 0:
        y = x + 1
    elif k == 1:
        y = x * 2
    else:
        if x.sum() > 0:
            return x - 1
            y = x  # left-over code after return
        y = x * 3
    return y


def nested_loops_reusing_names(x, n):
    total = 0
    for i in range(n):
        for i in range(n):  # the inner loop reuses the outer name
            total += i
            if total > 7:
                break
        if total > 12:
            break
    return x + total, i


def while_else_and_continue(x):
    i = 0
    hits = []
    while i < 6:
        i += 1
        if i % 2 == 0:
            continue
        hits.append(i)
        if x.sum().item() > 100:
            break
    else:
        hits.append(-1)
    return hits, x * i


def for_else_with_break(xs):
    for j, v in enumerate(xs):
        if v.item() < 0:
            found = j
            break
    else:
        found = None
    return found


def short_circuit_unbound(x, use):
    if use and x.sum() > 0:
        z = x + 1
    if use and z.sum() > 0:  # z is unbound when use is False: never read then
        return z
    return x


def try_with_and_walrus(x):
    out = []
    with torch.no_grad():
        try:
            if (s := x.sum().item()) > 0:
                out.append(s)
            raise ValueError("boom")
        except ValueError:
            out.append("caught")
        finally:
            out.append("finally")
    return out, s


def augassign_and_mutation(x):
    acc = x.clone()
    acc += 1
    acc[0] = 5.0
    stats = {"n": 0}
    for _ in range(3):
        stats["n"] += 1
        acc = acc * 2
    return acc, stats


def nested_function_and_lambda(x, k):
    scale = 2.0

    def f(t):
        return t * scale

    g = lambda t: t + k  # noqa: E731
    if k > 1:
        return f(g(x))
    return g(f(x))


def numpy_on_items(x):
    cs = [x[i].sum() for i in range(x.shape[0])]
    best = np.argmax([c.item() for c in cs])
    return x[best], best


CASES = [
    (early_return_in_else_chain, [(torch.randn(3), k) for k in (0, 1, 2, 2, 2)] + [(-torch.ones(3), 2)]),
    (nested_loops_reusing_names, [(torch.randn(2), n) for n in (1, 3, 5, 8)]),
    (while_else_and_continue, [(torch.randn(2),), (torch.full((2,), 100.0),)]),
    (for_else_with_break, [([torch.tensor(1.0), torch.tensor(-1.0)],), ([torch.tensor(1.0)],)]),
    (short_circuit_unbound, [(torch.randn(3), True), (torch.randn(3), False), (-torch.ones(3), True)]),
    (try_with_and_walrus, [(torch.randn(3),), (-torch.ones(3),)]),
    (augassign_and_mutation, [(torch.randn(3),)]),
    (nested_function_and_lambda, [(torch.randn(3), 1), (torch.randn(3), 2)]),
    (numpy_on_items, [(torch.randn(4, 3),)]),
]


def _same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), (a, b)
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), (a, b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    else:
        assert type(a) is type(b) and a == b, (a, b)


@pytest.mark.parametrize("fn,inputs", CASES, ids=[c[0].__name__ for c in CASES])
def test_dispatch_rewrite_keeps_python_semantics(fn, inputs) -> None:
    new = rewrite_function(fn, dispatch=True)
    assert new.__code__ is not fn.__code__
    for args in inputs:
        try:
            want = fn(*args)
        except Exception as exc:  # the rewrite must fail the same way
            # (a read inside a generated lambda is a free variable: NameError, UnboundLocalError's base)
            with pytest.raises(NameError if isinstance(exc, NameError) else type(exc)):
                new(*args)
            continue
        _same(want, new(*args))


def test_unbound_read_still_fails() -> None:
    def reads_unbound(x, flag):
        if flag:
            y = x
        return y

    def returns_unbound_pair(x, flag):  # the whole body is one tail island: its result is checked too
        if flag:
            y = x
        return y, x

    for fn in (reads_unbound, returns_unbound_pair):
        new = rewrite_function(fn, dispatch=True)
        with pytest.raises(UnboundLocalError):
            fn(torch.ones(1), False)
        with pytest.raises(UnboundLocalError):
            new(torch.ones(1), False)
        assert new(torch.ones(1), True) == fn(torch.ones(1), True)
