"""The user's names a converted construct can see: its own function's and the enclosing generated ones'."""
from __future__ import annotations

from typing import Any


def visible_locals(frame: Any) -> dict[str, Any]:
    """The locals of `frame` and, where `frame` runs a generated branch or body function
    (`_dycl_...`) that a construct decided by Python called, those of the functions it is nested
    in, up to the rewritten method: `v = x; a = v; for ...: if s > 2: ... else: (if t: ...)` runs
    the tensor `if` inside the Python `if`'s else-function, which does not take `a`, yet `a` is
    still the tensor `v` holds there, and the alias checks (operators.py) must see it. A name the
    inner function binds (even if not yet) hides the outer one, as Python's scoping does."""
    seen: dict[str, Any] = dict(frame.f_locals)
    hidden = set(frame.f_code.co_varnames) | set(frame.f_code.co_cellvars)
    file, code = frame.f_code.co_filename, frame.f_code
    outer = frame.f_back
    while code.co_name.startswith("_dycl_") and outer is not None:
        # frames of other files between the two (the operators, torch's tracing) are skipped
        if outer.f_code.co_filename == file:
            code = outer.f_code
            for name, value in outer.f_locals.items():
                if name not in hidden:
                    seen.setdefault(name, value)
            hidden |= set(code.co_varnames) | set(code.co_cellvars)
        outer = outer.f_back
    return seen
