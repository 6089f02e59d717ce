"""All user-facing error and warning classes of dycl_jax, in one place."""
from __future__ import annotations

import os
from dataclasses import dataclass


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


class CallError(DyclError):
    """A converted model was called with arguments that do not match its signature."""


class DecodeBoundError(DyclError):
    """A decode loop unrolled for `max_len` needed more iterations than that for this input."""


class UsageError(DyclError):
    """Bad command-line input: a missing module, file or factory, a bad shape or dtype."""


class ExportCoverageWarning(UserWarning):
    """`jm.export` of a dispatch-host model wrote an artifact that serves only some inputs (a path
    or signature not run before export); `str()` names the user's file and line and the fix.
    `jm.export(..., strict=True)` raises it as a DyclError instead."""


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
