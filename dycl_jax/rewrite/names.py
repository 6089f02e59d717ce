"""The user's variable names of each staged construct's tensor outputs and operands, for the report.

A `cond` / `while_loop` node of the captured graph returns a flat list of tensors; the output
plan (plan.py) knows which variable each one belongs to, and the branch functions' inputs
(liveness, converters/conditionals.py) which variable each operand is. The staging operators
record both here under the site's label; the report names the node's operands and outputs by
them where the recorded list lines up with the graph node (report/naming.py checks it).
"""
from __future__ import annotations

import re
import threading

from dycl_jax.rewrite.sites import RETFLAG, RETVAL

_NAMES: dict[tuple[str, int], tuple[str, ...]] = {}
_INPUTS: dict[tuple[str, int], tuple[str | None, ...]] = {}
_LOCK = threading.Lock()


def readable(name: str) -> str:
    """A variable name as the user knows it; internal names say what they are for."""
    base, bracket, rest = name.partition("[")
    if bracket and base.startswith("_dycl_"):
        return readable(base) + (bracket + rest if base == RETVAL else "")
    if name == RETVAL or re.fullmatch(r"_dycl_ret_\d+", name):  # the dispatch split's return temporaries
        return "return value"
    if name == RETFLAG:
        return "(returned flag)"
    if name.startswith("dycl_self__"):  # a module attribute kept as a local (converters/self_attributes.py)
        return "self." + name[len("dycl_self__"):]
    if name.startswith("_dycl_"):
        return "(exit flag)" if any(w in name for w in ("break", "continue", "brk", "cont")) else "(internal)"
    return name


def record(label: str, names: list[str]) -> None:
    """The tensor outputs of the construct at `label`, in order (one per graph output)."""
    with _LOCK:
        _NAMES[(label, len(names))] = tuple(names)


def outputs(label: str, count: int) -> tuple[str, ...] | None:
    """The recorded names of a construct with `count` tensor outputs, if known."""
    return _NAMES.get((label, count))


def record_inputs(label: str, names: list[str | None]) -> None:
    """The operands of the cond at `label`, in order: a variable's name, None for model state."""
    with _LOCK:
        _INPUTS[(label, len(names))] = tuple(names)


def inputs(label: str, count: int) -> tuple[str | None, ...] | None:
    """The recorded operand names of a cond with `count` operands, if known."""
    return _INPUTS.get((label, count))
