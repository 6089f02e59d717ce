"""Decision sites: the static facts about one rewritten construct that operators need at run time."""
from __future__ import annotations

import os
from dataclasses import dataclass

from dycl_jax.errors import Location

RETVAL = "_dycl_retval"  # the single-exit return value variable
RETFLAG = "_dycl_ret"
KINDS = ("if", "elif", "while", "ifexp", "guard")
# the fix of a StagedAliasError: Python control flow keeps which names are one tensor
ON_DISPATCH = ('convert with host="auto" (the default) or host="dispatch": they run this construct in Python, '
               'where every name of the tensor sees the update')


@dataclass(frozen=True)
class Site:
    """One cond/switch/while/ifexp call in generated code."""

    kind: str  # one of KINDS; "guard" marks the flag tests of early return / break / continue
    file: str
    line: int
    code: str
    names: tuple[str, ...]  # output variables (branches) or carried variables (while)
    paths: tuple[str, ...]  # how each path is called in messages ("true branch", ...)
    lines: tuple[tuple[int | None, ...], ...]  # per path, per name: line of its last assignment
    # names (of `names`) whose values are dead on the false path when that path means "an exit
    # flag is set": the program has returned, or left / restarted the loop, so they may hold
    # placeholders of the true path's shape there (converters/flags.dead_on_exit, exits.py)
    dead_on_exit: tuple[str, ...] = ()
    # names a path updates in place, and the user's names still read after the construct: an
    # in-place update must not be lost on another live name for the same tensor (operators.py)
    owned: tuple[str, ...] = ()
    live_after: tuple[str, ...] = ()
    # (n, m): output n, left unchanged on some path, may still be the tensor m holds, and one of
    # them is updated in place later while the other is read: torch's update reaches both on
    # that path, a converted construct's fresh output does not (operators.py refuses it)
    kept_aliases: tuple[tuple[str, str], ...] = ()
    # a join of the method's own return value in a method with an unrolled loop: its leaves that
    # differ in shape between the paths are padded (padding.py); the exit flags its test takes in
    pad: bool = False
    exit_flags: tuple[str, ...] = ()
    # the variables passed to the branch functions, in order (a cond's operands; for the report)
    inputs: tuple[str, ...] = ()
    # outputs that are inputs no path rebinds, only changes in place: a list or dict among them
    # stays the caller's object (appends.kept_in_place), as every other name holding it sees
    in_place: tuple[str, ...] = ()
    # (while) loop variables the body never rebinds (only reads or updates in place): two of
    # them that are one tensor at the loop stay one tensor (operators.while_loop merges them)
    unbound: tuple[str, ...] = ()
    # (view, base): a name read after the construct that an earlier statement made a view of a
    # tensor it updates in place; the statement after the construct makes it again from the new
    # base (converters/view_updates.py), so the view refusal does not apply to it
    rederived: tuple[tuple[str, str], ...] = ()
    # (while) of `owned`, the containers whose tensors the body may update in place (`xs[0].add_(v)`)
    deep: tuple[str, ...] = ()
    # (n, m): a path binds output n to the object m holds (`target = done`, `a = v`, a view of v)
    # and one of them is updated in place later while the other is read: torch's update reaches
    # both on that path, a converted construct's fresh output does not (operators.py refuses it)
    made_aliases: tuple[tuple[str, str], ...] = ()
    # of `kept_aliases`, those where m holding n as an element (`xs = [v]`) is a hazard too: n
    # updated in place later, or m's elements (converters/branches.element_hazards)
    kept_elements: tuple[tuple[str, str], ...] = ()
    # (if) `if c: break`: the loop's break flag and the branch (0 true, 1 false) that sets it on
    # every path through it, the other never assigning it; a chunk of the dispatch host's loop
    # takes the other branch and keeps the flag's state as an exit (rewrite/chunks.py)
    exit_branch: tuple[str, int] | None = None

    @property
    def label(self) -> str:
        return f"{self.kind}@{os.path.basename(self.file)}:{self.line}"

    @property
    def location(self) -> Location:
        return Location(self.file, self.line, self.code)

    @property
    def construct(self) -> str:
        word = {"if": "`if`", "elif": "`if`/`elif` chain", "while": "`while` loop", "ifexp": "conditional expression",
                "guard": "early exit (return/break/continue)"}[self.kind]
        return f"the {word} at {os.path.basename(self.file)}:{self.line}"

    def what(self, j: int) -> str:
        name = self.names[j]
        if name == RETVAL:
            return "the return value"
        if name == "_dycl_value":
            return "its value"
        if name.startswith("_dycl_"):
            return f"the internal variable {name!r}"
        return f"variable {name!r}"

    def path(self, path: int) -> str:
        return self.paths[min(path, len(self.paths) - 1)]

    def where(self, path: int, j: int) -> str:
        """'<path name> (file:line)' of the last assignment of output j on that path."""
        path = min(path, len(self.paths) - 1)
        line = self.lines[path][j] if path < len(self.lines) and j < len(self.lines[path]) else None
        if line is None:
            return f"{self.paths[path]} (unchanged there)"
        return f"{self.paths[path]} ({os.path.basename(self.file)}:{line})"
