"""Conversions and calls from several threads at once give the same results as one at a time:
a staged and a dispatch model converted concurrently, then each called from two threads."""
from __future__ import annotations

import threading

import torch

import dycl_jax
from examples.dynn import load
from differential import assert_same  # pytest puts tests/ on sys.path


def _run_in_threads(work: list) -> list:
    results: list = [None] * len(work)
    errors: list = []

    def run(i: int) -> None:
        try:
            results[i] = work[i]()
        except BaseException as exc:  # noqa: BLE001  (re-raised in the main thread below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def test_concurrent_conversions_and_calls_match_torch():
    # one staged, one needing the dispatch host (regions captured lazily: both heads' signatures
    # are first met while the threads run)
    names = ["pabee", "shape_branch"]
    mods = [load(n) for n in names]
    examples = [m.example() for m in mods]
    inputs = [m.inputs(12, seed=3) for m in mods]
    with torch.no_grad():
        expected = [[model(*a) for a in ins] for (model, _), ins in zip(examples, inputs)]

    # (auto would stage shape_branch as one padded program: the dispatch host is asked for)
    converted = _run_in_threads([lambda ex=ex, host=host: dycl_jax.to_jax(ex[0], ex[1], host=host)
                                 for ex, host in zip(examples, ["auto", "dispatch"])])
    assert [jm.host for jm in converted] == ["staged", "dispatch"]

    def calls(k: int, order: int):
        ins = inputs[k] if order == 0 else inputs[k][::-1]
        return [converted[k](*a) for a in ins]

    # both models, each from two threads, in different orders
    work = [lambda k=k, o=o: calls(k, o) for k in range(2) for o in range(2)]
    for (k, o), got in zip([(k, o) for k in range(2) for o in range(2)], _run_in_threads(work)):
        want = expected[k] if o == 0 else expected[k][::-1]
        for i, (w, g) in enumerate(zip(want, got)):
            assert_same(w, g, f"{names[k]} order {o} input {i}")
