"""Exceptions the user's code raises inside a path that a staged construct traces.

A graph construct traces every path, taken or not. A path that raises (`if h.max() > t: raise
Exit(h)`, caught in the forward as an early exit; `if x.isnan().any(): raise ValueError(...)`)
raises while it is traced: the forward's `except` would catch that trace-time exception and go
on with the path's traced tensors, and torch.export then fails with its own internal message.
`PathRaised` is a BaseException, so the user's `except Exit` / `except Exception` let it pass, and
the capture turns it into a located refusal (`refusal`): one staged program cannot raise; the
dispatch host runs the construct in Python, where the raise is Python's.
"""
from __future__ import annotations

import linecache
from typing import Any

from dycl_jax.errors import DyclError, Location, raised_by_us
from dycl_jax.rewrite.attribute_watch import user_file
from dycl_jax.rewrite.sites import Site
from dycl_jax.source import origins


class PathRaised(BaseException):
    """The user's code raised `exc` at `where` inside a traced path of `site`'s construct."""

    def __init__(self, site: Site, exc: Exception, where: Location):
        super().__init__(f"{type(exc).__name__} raised at {where}")
        self.site, self.exc, self.where = site, exc, where

    def refusal(self) -> DyclError:
        return DyclError(
            f"{self.site.construct}: a path raises `{type(self.exc).__name__}` under a tensor condition; one staged "
            "XLA program cannot raise, and every path of a staged construct is traced, taken or not (an exception "
            "caught in the method as an early exit would leave the traced path with its values)",
            location=self.where,
            fix='convert with host="auto" (the default) or host="dispatch": they run this construct in Python, '
                "where the raise and its `except` are Python's")


def raised_at(exc: BaseException) -> Location | None:
    """Where the user's code raised `exc` (the innermost frame of its traceback, in a user file), or
    None where torch, a library or this package raised it."""
    if raised_by_us(exc) or isinstance(exc, DyclError):
        return None
    tb = exc.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    file, line = tb.tb_frame.f_code.co_filename, tb.tb_lineno
    if not user_file(file):
        return None
    return origins.resolve(file, line) or Location(file, line, linecache.getline(file, line).strip())
