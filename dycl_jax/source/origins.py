"""Process-wide origin map: generated (rewritten) code lines → the user's file:line and sites."""
from __future__ import annotations

from dycl_jax.errors import Location

_LINES: dict[tuple[str, int], Location] = {}
_SITES: dict[tuple[str, int], str] = {}


def add(filename: str, line: int, origin: Location, site: str | None = None) -> None:
    """Record that generated `filename:line` came from `origin` (and holds decision `site`)."""
    _LINES[(filename, line)] = origin
    if site:
        _SITES[(filename, line)] = site


def resolve(filename: str, line: int) -> Location | None:
    """The user's location for a generated line, if known."""
    return _LINES.get((filename, line))


def site(filename: str, line: int) -> str | None:
    """The decision-site label of the operator call on a generated line, if any."""
    return _SITES.get((filename, line))
