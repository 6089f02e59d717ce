"""All user-facing error and warning classes of dycl_jax, in one place."""
from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Location:
    """A place in the user's source code."""

    file: str
    line: int
    code: str = ""

    def __str__(self) -> str:
        text = f"{self.file}:{self.line}"
        return f"{text}\n    {self.code.strip()}" if self.code else text


class DyclError(Exception):
    """A conversion or call problem the user can act on: says where, why, and what to do."""

    def __init__(self, message: str, *, location: Location | None = None, fix: str | None = None):
        self.message = message
        self.location = location
        self.fix = fix
        parts = [message]
        if location is not None:
            parts.append(f"  at {location}")
        if fix:
            parts.append(f"  fix: {fix}")
        super().__init__("\n".join(parts))


class UnsupportedOpError(DyclError):
    """An ATen operator with no JAX lowering."""


class UnsupportedDtypeError(DyclError):
    """A torch dtype JAX has no equivalent for (complex32): neither host can hold such a value."""


class DataDependentError(DyclError):
    """A size or slice bound comes from tensor values (`.item()`, a tensor of split points): one
    XLA program cannot hold the shape it decides; the dispatch host runs the statement."""


class RegistryError(DyclError):
    """A lowering registered twice, or registered for something that is not an ATen overload."""


class CaptureError(DyclError):
    """torch.export could not capture the (rewritten) program."""


class InputMutationError(CaptureError):
    """The method updates one of its inputs (or a buffer) in place: a converted model is a pure
    function and cannot update the caller's tensors, under either host."""


class AliasedUpdateError(CaptureError):
    """A branch updates a tensor in place that another live name also holds: torch changes both;
    a converted branch returns a new value to the name it updates only, under either host."""


class StagedAliasError(AliasedUpdateError):
    """A staged construct (`if`/`while` on a tensor) cannot keep an in-place update for every
    name that holds the tensor, because which names are one tensor depends on the path taken;
    Python control flow can (the dispatch host runs the construct in Python, its regions take
    names of one tensor as one array), so `host="auto"` and islands fall back on it."""


class PathMismatchError(DyclError):
    """The paths of a construct leave a variable with values one staged program cannot merge
    (different shapes, Python objects or structures): a padded program may (convert.py)."""


class CallError(DyclError):
    """A converted model was called with arguments that do not match its signature."""


class DecodeBoundError(DyclError):
    """A decode loop unrolled for `max_len` needed more iterations than that for this input."""


def decode_bound_error(where: Any) -> DecodeBoundError:
    """The error for an input whose unrolled decode loop (at `where`: file, line, code, max_len)
    did not reach its exit within max_len iterations."""
    file, line, code, max_len = where
    return DecodeBoundError(
        f"the loop at {os.path.basename(file)}:{line} was unrolled for at most max_len={max_len} iterations, "
        "and this input needs more: the staged program did not reach the loop's exit",
        location=Location(file, line, code),
        fix=f"convert with a larger max_len (e.g. max_len={2 * max_len}), or with host=\"auto\" / \"dispatch\" "
        "to run the loop exactly for every input")


class UsageError(DyclError):
    """Bad command-line input: a missing module, file or factory, a bad shape or dtype."""


class ExportCoverageWarning(UserWarning):
    """`jm.export` of a dispatch-host model wrote an artifact that serves only some inputs (a path
    or signature not run before export); `str()` names the user's file and line and the fix.
    `jm.export(..., strict=True)` raises it as a DyclError instead."""


def limitation(what: str, where: str, alternative: str | None = None) -> str:
    """The fix text of a refusal that no conversion option avoids (or only `alternative` may):
    `what` dycl_jax cannot keep, `where` in dycl_jax the limitation lies, and a request for a
    report. It never asks for a change to the model."""
    head = f"{alternative}; otherwise no" if alternative else "no"
    return (f"{head} conversion option keeps this yet ({what}): a limitation of dycl_jax ({where}), not an error "
            "in the model; please report it with the line above")


# exception types that, raised by dycl_jax's own code, are its bugs (never a user-facing refusal)
INTERNAL_TYPES = (NameError, KeyError, AssertionError, AttributeError, IndexError, UnboundLocalError)


def exception_chain(exc: BaseException | None) -> list[BaseException]:
    """`exc` and the exceptions it chains, outermost first, as Python's traceback shows them: an
    exception raised `from None` hides its context (a KeyError turned into a DyclError is not
    an internal KeyError), and the chain stops there."""
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return out


def raised_by_us(exc: BaseException) -> bool:
    """Whether `exc` (or an exception it chains) is one of INTERNAL_TYPES raised inside dycl_jax's
    own code, rather than in torch, JAX or the user's program."""
    for e in exception_chain(exc):
        if isinstance(e, INTERNAL_TYPES) and e.__traceback__ is not None:
            tb = e.__traceback__
            while tb.tb_next is not None:
                tb = tb.tb_next
            if in_package(tb.tb_frame.f_code.co_filename):
                return True
    return False


def in_package(file: str) -> bool:
    """Whether `file` is one of dycl_jax's own source files (by its folder, not by a name in its path)."""
    return os.path.abspath(file).startswith(_PACKAGE)


# this package's folder: a user's file under a checkout folder that happens to be named
# `dycl_jax` (its tests, its examples) is not our code
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


# torch's and JAX's own code, and the standard library: the frames a traceback passes through
# between our code (or the user's) and where such a library raises
_LIBRARIES = ("torch", "jax", "jaxlib", "numpy", "sympy", "optree")
_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep
# our functions that only hand the user's (rewritten) program to torch, or stand in for one of
# torch's own (the shared branch checks): torch failing beneath them judges that program, so
# their frames count as torch's (file under the package, function name)
HANDS_TO_TORCH = frozenset({("capture/export.py", "capture"), ("capture/export.py", "to_core_aten"),
                            ("capture/export.py", "run_core_aten_decompositions"),
                            ("capture/composite_override.py", "_force_dispatch_to_orig_cia"),
                            ("capture/branch_checks.py", "shared_schema"),
                            ("capture/branch_checks.py", "shared_check"),
                            ("capture/branch_traces.py", "shared_fake")})


def provoked_by_us(exc: BaseException) -> BaseException | None:
    """The exception in `exc`'s chain, not a DyclError, that dycl_jax's own code provoked: raised
    by it (`raised_by_us`, any type), or by torch or JAX where the innermost frame outside those
    libraries is ours, not the user's (our own call of a torch function failed: a version
    counter read on an inference tensor). Frames of `HANDS_TO_TORCH` are torch's. Such an error is a
    bug to report, never a reason for `host="auto"` to move to the dispatch host. A frame of the
    user's rewritten code (`<dycl-rewrite...>`) is the user's. A DyclError raised while handling
    an exception (not `from` it: a located refusal that explains it, as a branch shape mismatch
    explains lax.cond's TypeError) ends the search. None where there is no such one."""
    chain = exception_chain(exc)
    for before, e in zip([None, *chain], chain):
        if isinstance(before, DyclError) and before.__cause__ is not e:
            break  # a refusal raised while handling `e` (not `from` it): its verdict on `e` stands
        if isinstance(e, DyclError) or e.__traceback__ is None or type(e).__module__.startswith("dycl_jax."):
            continue  # (a signal of our own, `bounded_rows._Unproven`, turned into a refusal on purpose)
        last = None
        tb = e.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if not _library(code.co_filename) and not _hands_to_torch(code.co_filename, code.co_name):
                last = code.co_filename
            tb = tb.tb_next
        if last is not None and in_package(last):
            return e
    return None


def _hands_to_torch(file: str, function: str) -> bool:
    path = os.path.abspath(file)
    where = os.path.relpath(path, _PACKAGE).replace(os.sep, "/")
    return path.startswith(_PACKAGE) and (where, function) in HANDS_TO_TORCH


def _library(file: str) -> bool:
    if file.startswith("<"):
        return not file.startswith("<dycl-rewrite")  # (`<frozen ...>`, fx's `<eval_with_key>`)
    path = os.path.realpath(file)
    if in_package(path):
        return False
    for name in _LIBRARIES:
        module = sys.modules.get(name)
        root = os.path.dirname(os.path.realpath(module.__file__)) + os.sep if module and module.__file__ else None
        if root and path.startswith(root):
            return True
    return path.startswith(_STDLIB) and "-packages" not in path
