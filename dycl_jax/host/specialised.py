"""Islands whose program holds the values of Python ints it takes: compiled on a signature's second call, a bounded number.

An island that takes Python ints its graph needs as constants (`for t in range(max(lengths))`
unrolled for the `lengths` read from a tensor, `h[:n]` sizes) is one program per combination
of those values. Compiling each combination on first sight would cost a compile (seconds for
an unrolled decoder) on every call whose values are new, so a combination is compiled only on
its second call (the first runs the island's host version: regions with the ints symbolic,
which serve any values), and an island that has compiled `PROGRAMS` of them runs its host
version from then on. Values seen again, as in serving the same shapes, run as one program.
A region part whose programs differ only in the Python floats they hold (`x * score`, `score`
read with `.item()`) is admitted the same way, its first sight of a value run on the host.
"""
from __future__ import annotations

from typing import Any

PROGRAMS = 16  # programs one island compiles for distinct int values before it stays on the host
_SEEN = 4096  # signatures remembered as seen once (then forgotten, all at once)


class Deferred(Exception):
    """This call runs the island's host version: its int values are new (see the module's text)."""


def ints_differ(key: tuple, other: tuple) -> bool:
    """Whether two signature keys (tree, leaf keys, grad mode, aliased leaves: host/values.call_key)
    differ only in the values of int leaves: the same arrays' shapes and dtypes, other ints."""
    return _differ_only_in(int, key, other)


def floats_differ(key: tuple, other: tuple) -> bool:
    """Whether two signature keys differ only in the values of float leaves (a region's program
    holds the Python floats it takes as constants: `x * score` with `score` from `.item()`)."""
    return _differ_only_in(float, key, other)


def _differ_only_in(kind: type, key: tuple, other: tuple) -> bool:
    if key[0] != other[0] or key[2:] != other[2:] or len(key[1]) != len(other[1]):
        return False
    return all(a == b or a[0] is kind and b[0] is kind for a, b in zip(key[1], other[1]))


def admit(seen: set, programs: int, key: Any) -> str:
    """What an island specialised to its ints does on a call with signature `key` and no program:
    "defer" (first sight: the host version runs, `key` is remembered), "compile", or "host" (it
    has `programs` >= PROGRAMS programs already)."""
    if programs >= PROGRAMS:
        return "host"
    if key in seen:
        return "compile"
    if len(seen) >= _SEEN:
        seen.clear()
    seen.add(key)
    return "defer"


def float_reason() -> str:
    """The report's reason for a region part whose programs differ in float values only, once it
    has PROGRAMS of them (a value new at every call would compile on every call)."""
    return (f"its program holds the values of Python floats it takes, which took more than {PROGRAMS} "
            "combinations (a float new at every call would compile at every call); it runs on the host")


def host_reason() -> str:
    """The report's reason for an island that reached PROGRAMS programs (read when it does: a
    test may lower PROGRAMS)."""
    return (f"its program holds the values of Python ints it takes, which took more than {PROGRAMS} "
            "combinations; its host version serves any values")
