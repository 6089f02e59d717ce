"""Choosing the host: staged wherever the whole method stages, dispatch otherwise, and the
located error `host="staged"` gives for a construct only the dispatch host can run."""
from __future__ import annotations

import ast
import linecache
import os
import traceback

from dycl_jax.errors import (CaptureError, DataDependentError, DyclError, Location, exception_chain, provoked_by_us,
                             raised_by_us)
from dycl_jax.rewrite import modes
from dycl_jax.source import origins

HOSTS = ("auto", "staged", "dispatch")
# torch.export's ways of saying "a tensor's value decides a shape or a Python value here"
_DATA_DEPENDENT = ("GuardOnDataDependentSymNode", "DataDependentOutputException", "PendingUnbackedSymbolNotFound",
                   "UserError", "data-dependent", "data dependent", "unbacked")
# torch.cond's ways of saying "the two branches give outputs of different layout or structure":
# a branch mismatch, which the dispatch host's Python `if` does not have
_BRANCH_MISMATCH = ("two branches' output", "torch.cond branches", "true branch returns", "false branch has")
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
    if _data_dependent(exc):
        return ("a tensor's value decides a shape or a Python value here (data-dependent), which one "
                "XLA program cannot hold")
    return text[:400]


def staged_refusal(exc: DyclError) -> DyclError:
    """The located error for `host="staged"` when the method needs the dispatch host. Where a
    Python value's use failed (data-dependent) after a tensor-decided loop made it a tensor (a
    counter of a `while` with an `.item()`-decided `break`), the loop is the cause: the error
    points at it and names the value."""
    loc = exc.location or user_location(exc)
    fix = 'convert with host="auto" (the default) or host="dispatch": that host runs this construct in Python'
    if exc.fix and 'host="dispatch"' in exc.fix:
        fix = exc.fix  # (it names the host already)
    elif exc.fix:
        fix = f"{exc.fix}; or {fix}"
    summary = _summary(exc)
    loops = [(site, names) for site, names in (modes.promoted() if _data_dependent(exc) and loc else [])
             if site.file == loc.file and site.line < loc.line and _reaches(site.file, site.line, loc, names)]
    if loops:
        site, names = loops[0]
        used = f" (used at {os.path.basename(loc.file)}:{loc.line} `{loc.code}`)" if loc else ""
        summary = (f"{site.construct} decides on a tensor's value how long a loop runs, so the Python value "
                   f"{', '.join(f'`{n}`' for n in names)} that the loop changes becomes a tensor, whose value one "
                   f"XLA program cannot give to Python{used}")
        loc = site.location or loc
    return type(exc)(f"the method cannot run as one staged XLA program: {summary}", location=loc, fix=fix)


def _reaches(file: str, start: int, loc: Location, names: tuple[str, ...]) -> bool:
    """Whether the failing line `loc` reads one of `names`, or a name the lines from `start` to
    it assign or append from them (`steps.append(n)`, then `int(np.sum(steps))`): a line-wise
    approximation of the data flow, enough to tell the loop's counter from an unrelated failure."""
    flow = set(names)
    for line in range(start, loc.line + 1):
        try:
            tree = ast.parse(linecache.getline(file, line).strip())
        except SyntaxError:  # a compound statement's header (`while True:`, `if ...:`)
            continue
        for node in ast.walk(tree):
            reads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            if line == loc.line and reads & flow:
                return True
            if isinstance(node, ast.Assign) and reads & flow:
                flow |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and node.func.attr in ("append", "extend", "insert") \
                    and reads & flow:
                flow.add(node.func.value.id)
    return False


def _data_dependent(exc: DyclError) -> bool:
    root = exception_chain(exc)[-1]
    return isinstance(exc, CaptureError) and any(k in f"{type(root).__name__} {root}" for k in _DATA_DEPENDENT)


def internal_cause(exc: DyclError) -> BaseException | None:
    """The exception under `exc` that our own code provoked (`errors.provoked_by_us`): a bug,
    which the staged attempt must raise as itself rather than move to the dispatch host or
    relabel. A data-dependent failure or torch.cond's branch mismatch (strides, structure) is not
    one, wherever torch raised it: those are what the dispatch host is for. None where `exc` is a refusal that may move to the dispatch host."""
    chain = exception_chain(exc)
    internal = next((e for e in chain if raised_by_us(e)), None)
    # torch's own exception anywhere in the chain (not only its root: the guard may be raised
    # while torch handles another exception of its own, which is then the root)
    said = [f"{type(e).__name__} {e}" for e in chain if not isinstance(e, DyclError)]
    documented = any(isinstance(e, DataDependentError) for e in chain) \
        or any(k in text for text in said for k in (*_DATA_DEPENDENT, *_BRANCH_MISMATCH))
    if internal is None and not documented:
        internal = provoked_by_us(exc)
    return noted(internal) if internal is not None else None


_NOTE = ("raised inside dycl_jax while staging the method: a dycl_jax bug, please report it (host=\"auto\" did not "
         "move to the dispatch host, which would hide it)")


def noted(exc: BaseException) -> BaseException:
    """`exc`, our own bug surfacing from the staged attempt, with a note asking to report it (once)."""
    if _NOTE not in getattr(exc, "__notes__", ()):
        exc.add_note(_NOTE)
    return exc
