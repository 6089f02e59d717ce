"""Paired benchmark rounds: every function runs in every position and after every other one equally often."""
from __future__ import annotations

from collections import Counter

import pytest

from dycl_jax.command.bench import balanced_orders, interleaved


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_balanced_orders_pair_every_function_with_every_other(n: int) -> None:
    rows = balanced_orders(n)
    assert all(sorted(r) == list(range(n)) for r in rows)
    follows = Counter((r[i], r[i + 1]) for r in rows for i in range(n - 1))
    positions = Counter((f, i) for r in rows for i, f in enumerate(r))
    assert len(follows) == n * (n - 1) and len(set(follows.values())) == 1
    assert len(positions) == n * n and len(set(positions.values())) == 1


def test_interleaved_runs_each_function_once_per_round_on_the_rounds_input() -> None:
    calls: list[tuple[int, int]] = []
    fns = [lambda k, j=j: calls.append((j, k)) for j in range(3)]
    interleaved(fns, [[(k,) for k in range(2)]] * 3, runs=4, warmup=2)
    assert len(calls) == 18
    assert [sorted(calls[i:i + 3]) for i in range(0, 18, 3)] == [[(0, k % 2), (1, k % 2), (2, k % 2)] for k in range(6)]
