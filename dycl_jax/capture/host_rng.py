"""Draws from Python's or numpy's global random generator, and clock reads, while a program is traced or captured.

`random.random() < p` or `np.random.randint(3)` in a forward (exploration, a random depth)
runs once when torch.export traces the code: the program would hold that one number and take
the same path on every call, where torch draws again each time. Torch's own generator is not
this module's: its draws are graph ops (the staged host refuses them, the dispatch host runs
them in torch). The states are compared around each capture; a capture that drew is refused
(staged) or run on the host, where Python draws on every call (dispatch), and the generators
are put back, so the host's draws are the numbers torch's run would see under the same seed.
A read of the clock (`time.perf_counter()` against a time budget) is the same kind of input:
capture/host_clock.py counts them, and the count is part of the state compared here (a clock is
not put back).
"""
from __future__ import annotations

import ast
import inspect
import os
import random
import textwrap
import types
from typing import Any, Iterable

import numpy as np

from dycl_jax.capture import host_clock
from dycl_jax.errors import DyclError, Location

_MODULES = ("random", "numpy.random", "numpy.random.mtrand")


class Drawn(Exception):
    """A capture drew from Python's or numpy's generator or read the clock (the message says which)."""


def state() -> tuple[Any, Any, int]:
    return random.getstate(), np.random.get_state(), host_clock.count()


def drawn(before: tuple[Any, Any, int]) -> str | None:
    """Which generator advanced since `before` ("random" or "numpy.random"), or the clock function
    the user's code read ("time.perf_counter"), or None."""
    if random.getstate() != before[0]:
        return "random"
    now = np.random.get_state()
    if now[2] != before[1][2] or not np.array_equal(now[1], before[1][1]) or now[3:] != before[1][3:]:
        return "numpy.random"
    if host_clock.count() != before[2]:
        read = host_clock.last_read()
        return read.function if read is not None else "time"
    return None


def restore(before: tuple[Any, Any, int]) -> str | None:
    """Put the generators back as they were at `before`; which one had advanced, or which clock was
    read (`drawn`), if any."""
    which = drawn(before)
    random.setstate(before[0])
    np.random.set_state(before[1])
    return which


def is_clock(which: str) -> bool:
    """Whether `drawn`'s answer is a clock read ("time.time", "datetime.now") rather than a generator."""
    return which not in ("random", "numpy.random")


def effect(which: str) -> str:
    """What the code did, for a message: "draws from random's global generator", "reads the clock (time.time)"."""
    if is_clock(which):
        return f"reads the clock ({which})"
    return f"draws from {which}'s global generator"


def refusal(which: str, functions: Iterable[types.FunctionType]) -> DyclError:
    """The staged host's located error: the first read of the clock, or the first call of the
    generator in the model's code."""
    if is_clock(which):
        read = host_clock.last_read()
        return DyclError(
            f"the method {effect(which)} while it is traced; one staged XLA program would hold that one reading "
            "and take the same path on every call, where torch reads the clock again each time",
            location=read.location if read is not None else None,
            fix='convert with host="auto" (the default) or host="dispatch": that host runs the statement that '
                "reads the clock in Python on every call")
    return DyclError(
        f"the method {effect(which)} while it is traced; one staged XLA program would hold "
        "that one number and take the same path on every call, where torch draws again each time",
        location=find_draw(functions),
        fix='convert with host="auto" (the default) or host="dispatch": that host runs the statement that draws '
            "in Python on every call")


def find_draw(functions: Iterable[types.FunctionType]) -> Location | None:
    """The first call in these functions' source of a function of `random` or `numpy.random`."""
    for fn in functions:
        try:
            lines, start = inspect.getsourcelines(fn)
            tree = ast.parse(textwrap.dedent("".join(lines)))
            file = inspect.getsourcefile(fn) or "?"
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _is_draw(node.func, fn.__globals__):
                line = start + node.lineno - 1
                return Location(os.path.abspath(file), line, lines[node.lineno - 1].strip())
    return None


def _is_draw(func: ast.expr, namespace: dict) -> bool:
    """`random.random`, `np.random.randint`, `numpy.random.rand`, or a name bound to one of them."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return False
    value: Any = namespace.get(func.id)
    for attr in reversed(parts):
        value = getattr(value, attr, None)
    if isinstance(value, types.ModuleType):
        return False
    owner = getattr(value, "__module__", None) or getattr(getattr(value, "__self__", None), "__module__", None)
    return owner in _MODULES or type(getattr(value, "__self__", None)).__module__ in _MODULES
