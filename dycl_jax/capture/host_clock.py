"""Clock reads in the user's code while a program is captured.

`start = time.perf_counter()` ... `if time.perf_counter() - start > budget: break` (anytime
inference under a time budget) reads the clock once when torch.export traces the code: a program
would hold that one reading and take the same path on every call, where torch reads the clock
again each time. While `watched()` is active, the `time` module's clock functions (and the user's
globals bound to them, `from time import perf_counter`), and `now`/`utcnow`/`today` of the
`datetime` module's classes (a counting subclass stands in for `datetime.datetime` and
`datetime.date` there and in the user's globals bound to them), count the reads made by the user's code
(library frames, torch's own timers among them, pass through uncounted); host_rng compares the
count around each capture as it compares the random generators' states.
"""
from __future__ import annotations

import contextlib
import datetime
import linecache
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from dycl_jax.errors import Location
from dycl_jax.rewrite.attribute_watch import user_file, user_space
from dycl_jax.source import origins

_NAMES = ("time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time",
          "process_time_ns", "thread_time", "thread_time_ns", "clock_gettime", "clock_gettime_ns")
_ORIGINALS: dict[str, Callable[..., Any]] = {n: getattr(time, n) for n in _NAMES if hasattr(time, n)}


@dataclass(frozen=True)
class Read:
    """One read of the clock by the user's code: which function, and where."""

    function: str  # "time.perf_counter"
    location: Location | None


_count = 0  # reads by the user's code while watched, ever (host_rng compares it around a capture)
_first: Read | None = None  # the latest watch's first read (its location for the refusal)
_depth = 0  # nested watches install the wrappers once


def count() -> int:
    return _count


def last_read() -> Read | None:
    """The first read seen by the latest watch that saw one."""
    return _first


@contextlib.contextmanager
def watched() -> Iterator[None]:
    """Count the user's clock reads for the duration."""
    global _depth, _first
    if _depth:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    _first = None
    # what the names hold now (a test's fake clock included) is wrapped, and put back after
    current = {name: getattr(time, name) for name in _ORIGINALS}
    wrappers = {name: _wrapper(name, fn) for name, fn in current.items()}
    clocks, dates = _aliases(current)
    aliases = [(namespace, key, value, wrappers[name] if value is current[name] else _wrapper(name, value))
               for namespace, key, name, value in clocks]
    aliases += _date_classes(dates)
    for name, wrapper in wrappers.items():
        setattr(time, name, wrapper)
    for namespace, key, _, wrapper in aliases:
        namespace[key] = wrapper
    _depth = 1
    try:
        yield
    finally:
        _depth = 0
        for name, fn in current.items():
            setattr(time, name, fn)
        for namespace, key, value, wrapper in aliases:
            if namespace.get(key) is wrapper:  # (unless the user's code rebound the name meanwhile)
                namespace[key] = value


_DATE_CLASSES = (datetime.datetime, datetime.date)
_DATE_READS = ("now", "utcnow", "today")


def _date_classes(user: list[tuple[dict, str, type]]) -> list[tuple[dict, str, type, type]]:
    """(namespace, key, the class, its counting subclass) for `datetime.datetime` and
    `datetime.date` in the `datetime` module and the `user` globals bound to them or to a subclass
    (`from datetime import datetime`): a C type's methods cannot be wrapped in place, so a
    subclass whose `now`, `utcnow` and `today` count the user's reads stands in for the class."""
    places = [(vars(datetime), c.__name__, c) for c in _DATE_CLASSES] + user
    made: dict[int, type] = {}
    out = []
    for namespace, key, cls in places:
        counting = made.get(id(cls))
        if counting is None:
            counting = made[id(cls)] = _counting_class(cls)
        out.append((namespace, key, cls, counting))
    return out


def _counting_class(cls: type) -> type:
    """A subclass of `cls` whose reads of the clock by the user's code are counted."""
    def reader(name: str) -> classmethod:
        def read(klass: type, *args: Any) -> Any:
            frame = sys._getframe(1)
            if user_file(frame.f_code.co_filename):
                _record(f"{cls.__name__}.{name}", frame)
            return getattr(super(counting, klass), name)(*args)
        read.__name__ = read.__qualname__ = name
        return classmethod(read)

    counting = type(cls.__name__, (cls,), {n: reader(n) for n in _DATE_READS if hasattr(cls, n)})
    counting.__module__ = cls.__module__
    return counting


def _aliases(current: dict[str, Callable[..., Any]]) -> tuple[list[tuple[dict, str, str, Any]],
                                                               list[tuple[dict, str, type]]]:
    """Globals of the user's modules bound to a clock function (`from time import perf_counter as
    now`): (globals, key, which clock, the value); and those bound to a `datetime` class or a
    subclass of one (`from datetime import datetime`): (globals, key, the class). One pass."""
    known = {id(fn): (name, fn) for name in current for fn in (current[name], _ORIGINALS[name])}
    found, dates = [], []
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict) or not _user_module(module, namespace):
            continue
        for key, value in list(namespace.items()):
            hit = known.get(id(value))
            if hit is not None and value is hit[1]:
                found.append((namespace, key, hit[0], value))
            elif isinstance(value, type) and issubclass(value, _DATE_CLASSES):
                dates.append((namespace, key, value))
    return found, dates


_USER_MODULES: dict[int, tuple[Any, bool]] = {}  # id(module) -> (module, whether it is the user's)


def _user_module(module: Any, namespace: dict) -> bool:
    seen = _USER_MODULES.get(id(module))
    if seen is None or seen[0] is not module:
        seen = _USER_MODULES[id(module)] = (module, user_space(namespace))
    return seen[1]


def _wrapper(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def read(*args: Any) -> Any:
        frame = sys._getframe(1)
        if user_file(frame.f_code.co_filename):
            _record(f"time.{name}", frame)
        return original(*args)

    read.__name__ = read.__qualname__ = name
    read.__wrapped__ = original  # type: ignore[attr-defined]
    return read


def _record(function: str, frame: Any) -> None:
    global _count, _first
    _count += 1
    if _first is None:
        file, line = frame.f_code.co_filename, frame.f_lineno
        where = origins.resolve(file, line) or Location(file, line, linecache.getline(file, line).strip())
        _first = Read(function, where)
