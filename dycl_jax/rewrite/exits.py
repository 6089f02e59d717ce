"""Exit-only paths: where a false branch only means "an exit flag is set" (the function has
returned, or the loop is left or restarted), variables dead after that exit may take
placeholders of the other path's shape (the converters compute which: flags.dead_on_exit)."""
from __future__ import annotations

from typing import Any, Callable

import torch

from dycl_jax.rewrite import modes
from dycl_jax.rewrite.constants import static
from dycl_jax.rewrite.plan import Undefined
from dycl_jax.rewrite.sites import Site


def _traced() -> bool:
    return modes.current() != "plain"


class ExitOnly:
    """A tensor predicate that is false only when an exit flag is set (see `unless`): on the
    false path the variables dead after that exit may hold placeholders."""

    __slots__ = ("pred",)

    def __init__(self, pred: torch.Tensor) -> None:
        self.pred = pred


def unless(flags: tuple, test_fn: Callable[[], Any]) -> Any:
    """`not f1 and not f2 ... and test()` for an `if` that takes exit flags into its test.

    With tensor flags and a test that is a Python true value, a false result means "an exit
    flag is set", like a guard's: it comes back as ExitOnly so the cond can treat it so."""
    tensors = []
    for f in flags:
        if isinstance(f, torch.Tensor) and _traced():
            tensors.append(f)
        elif f:  # Python short-circuit (a tensor flag in plain mode: its truth value)
            return False
    test = static(test_fn())  # a constant-built test is decided now, like a Python one
    if not tensors:
        return test
    running = torch.logical_not(tensors[0])
    for f in tensors[1:]:
        running = torch.logical_and(running, torch.logical_not(f))
    if isinstance(test, ExitOnly):
        return ExitOnly(torch.logical_and(running, test.pred))
    if isinstance(test, torch.Tensor):
        return _gated(torch.logical_and(running, test), running)
    return ExitOnly(running) if test else False


def _gated(pred: torch.Tensor, running: torch.Tensor) -> torch.Tensor:
    # the user's test is evaluated only where no exit flag is set: a padded program records
    # its decision only there (padding.mark)
    pred._dycl_running = running
    return pred


def running(pred: Any) -> torch.Tensor | None:
    """Where the user's test in `pred` (from `unless`) is evaluated: no exit flag set; None if always."""
    return getattr(pred, "_dycl_running", None)


def with_dead(fn: Callable, site: Site) -> Callable:
    """The exit path of `site` with the variables dead after the exit left undefined (so the
    output plan gives them placeholders of the other path's shape)."""
    dead = [j for j, n in enumerate(site.names) if n in site.dead_on_exit]

    def run(*args: Any) -> tuple:
        out = list(fn(*args))
        for j in dead:
            out[j] = Undefined(site.names[j])
        return tuple(out)

    return run
