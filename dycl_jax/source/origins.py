"""Process-wide origin map: generated (rewritten) code lines → the user's file:line and sites."""
from __future__ import annotations

import linecache
import threading

from dycl_jax.errors import Location

_LINES: dict[tuple[str, int], Location] = {}
_SITES: dict[tuple[str, int], str] = {}
_TEXTS: dict[str, str] = {}
_LOCK = threading.Lock()


def add(filename: str, line: int, origin: Location, site: str | None = None) -> None:
    """Record that generated `filename:line` came from `origin` (and holds decision `site`)."""
    _LINES[(filename, line)] = origin
    if site:
        _SITES[(filename, line)] = site


def unique_filename(stem: str, text: str) -> str:
    """`<dycl-rewrite:STEM>`, numbered when another text already holds that name."""
    with _LOCK:
        name, n = f"<dycl-rewrite:{stem}>", 1
        while name in _TEXTS and _TEXTS[name] != text:
            n += 1
            name = f"<dycl-rewrite:{stem}#{n}>"
        _TEXTS[name] = text
        return name


def register_text(filename: str, text: str) -> None:
    """Put generated source in linecache, so tracebacks and inspect show it."""
    lines = text.splitlines(keepends=True)
    # mtime None: linecache.checkcache never drops an entry that has no file behind it
    linecache.cache[filename] = (len(text), None, lines, filename)


def resolve(filename: str, line: int) -> Location | None:
    """The user's location for a generated line, if known."""
    return _LINES.get((filename, line))


def site(filename: str, line: int) -> str | None:
    """The decision-site label of the operator call on a generated line, if any."""
    return _SITES.get((filename, line))


def is_decision(label: str | None) -> bool:
    """Whether a site records a decision; `guard@` sites are internal (early-exit flags)."""
    return bool(label) and not label.startswith("guard@")
