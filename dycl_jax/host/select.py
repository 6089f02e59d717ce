"""Choosing the host: staged wherever the whole method stages, dispatch otherwise, and the
located error `host="staged"` gives for a construct only the dispatch host can run."""
from __future__ import annotations

import os
import traceback

from dycl_jax.errors import CaptureError, DyclError, Location, exception_chain
from dycl_jax.source import origins

HOSTS = ("auto", "staged", "dispatch")
# torch.export's ways of saying "a tensor's value decides a shape or a Python value here"
_DATA_DEPENDENT = ("GuardOnDataDependentSymNode", "DataDependentOutputException", "PendingUnbackedSymbolNotFound",
                   "UserError", "data-dependent", "data dependent", "unbacked")
_OWN = (f"{os.sep}dycl_jax{os.sep}", f"{os.sep}torch{os.sep}", f"{os.sep}jax{os.sep}", f"{os.sep}contextlib.py",
        f"{os.sep}functools.py", "<frozen", "<eval_with_key>", "site-packages", "dist-packages")


def user_location(exc: BaseException) -> Location | None:
    """The innermost frame of the user's code (or of its rewritten version) in the traceback."""
    best: Location | None = None
    for e in exception_chain(exc):
        for frame in traceback.extract_tb(e.__traceback__):
            if frame.filename.startswith("<dycl-rewrite"):
                loc = origins.resolve(frame.filename, frame.lineno or 0)
                best = loc or best
            elif not any(p in frame.filename for p in _OWN) and os.path.exists(frame.filename):
                best = Location(frame.filename, frame.lineno or 0, (frame.line or "").strip())
    return best


def dispatch_reason(exc: DyclError) -> str:
    """One line saying which construct needs the dispatch host, and where."""
    loc = exc.location or user_location(exc)
    where = f"{os.path.basename(loc.file)}:{loc.line} `{loc.code}`: " if loc else ""
    return f"{where}{_summary(exc)}"


def _summary(exc: DyclError) -> str:
    text = " ".join(str(exc.message if hasattr(exc, "message") else exc).split())
    root = exception_chain(exc)[-1]
    if isinstance(exc, CaptureError) and any(k in f"{type(root).__name__} {root}" for k in _DATA_DEPENDENT):
        return ("a tensor's value decides a shape or a Python value here (data-dependent), which one "
                "XLA program cannot hold")
    return text[:400]


def staged_refusal(exc: DyclError) -> DyclError:
    """The located error for `host="staged"` when the method needs the dispatch host."""
    loc = exc.location or user_location(exc)
    fix = 'convert with host="auto" (the default) or host="dispatch": that host runs this construct in Python'
    if exc.fix:
        fix = f"{exc.fix}; or {fix}"
    err = type(exc)(f"the method cannot run as one staged XLA program: {_summary(exc)}", location=loc, fix=fix)
    return err
