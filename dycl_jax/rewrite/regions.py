"""Regions of the dispatch rewrite: their static description, and the `region` / `decide`
operators generated host code calls. How a region runs (compiled, on the host) is decided by
an executor the host stage installs; without one, regions run as plain Python (torch eager)."""
from __future__ import annotations

import contextlib
import contextvars
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence

from dycl_jax.errors import Location
from dycl_jax.rewrite import modes
from dycl_jax.rewrite.appends import shared_containers
from dycl_jax.rewrite.decisions import Decision
from dycl_jax.rewrite.plan import Undefined
from dycl_jax.rewrite.sites import Site


@dataclass(frozen=True)
class StatementSpec:
    """One simple statement of a region, as the function `fn(*ins) -> outs` generated for it."""

    fn: str
    ins: tuple[str, ...]
    outs: tuple[str, ...]
    line: int
    code: str
    # names the statement only appends to (`xs.append(v)`, `v` not reading `xs`): a region that
    # only appends to a list can take it empty and have the host extend the caller's list
    appends: tuple[str, ...] = ()
    # the names it binds to another object (not those it changes in place: `xs.append(v)`),
    # and among them those bound to what another name holds (`saved = xs`): which of a
    # region's outputs are one list or dict (`identities`)
    binds: tuple[str, ...] = ()
    copies: tuple[tuple[str, str], ...] = ()
    # a read (`n = t.tolist()`, `sel = t.nonzero()`, `y = t[m]`: host_reads.ReadForm): the host
    # reads the array with numpy (host/reads.py)
    read: Any = None
    # the function's names that may hold a tensor it updates in place, and a container whose
    # elements it updates in place (None: not known): a later part of its region may change a
    # view's base (host/views.py)
    updates: frozenset[str] | None = frozenset()
    deep_updates: frozenset[str] | None = frozenset()
    # names it only passes through, as they may hold the tensor it updates (not read by it)
    passes: tuple[str, ...] = ()


def identities(statements: Sequence[StatementSpec], ins: Sequence[str],
               outs: Sequence[str]) -> tuple[tuple[int, bool, int], ...]:
    """(output, from an input?, its position) for each output that is the object another
    output, or an input as it came in, holds when the statements are done (`saved = xs` makes
    `saved` the caller's `xs`). A compiled program, or a host statement's conversion to arrays,
    gives every output a new container, so the host rebinds these (`appends.kept_identity`)."""
    holds: dict[str, Any] = {n: ("in", n) for n in ins}  # name -> the object it holds, by origin
    for k, st in enumerate(statements):
        before = dict(holds)
        copied = dict(st.copies)
        for n in st.binds:
            holds[n] = before.get(copied[n], ("new", k, n)) if n in copied else ("new", k, n)
    pairs: list[tuple[int, bool, int]] = []
    first: dict[Any, int] = {}
    for o, n in enumerate(outs):
        origin = holds.get(n, ("new", -1, n))
        if origin[0] == "in" and origin[1] != n and origin[1] in ins:
            pairs.append((o, True, list(ins).index(origin[1])))
        elif origin in first:
            pairs.append((o, False, first[origin]))
        else:
            first[origin] = o
    return tuple(pairs)


@dataclass(frozen=True, eq=False)
class RegionSpec:
    """A run of simple statements between two host decisions (identity is the region)."""

    file: str
    line: int
    statements: tuple[StatementSpec, ...]
    ins: tuple[str, ...]
    outs: tuple[str, ...]
    kind: str = "region"
    tail: bool = False  # an island that ends the function: its result is the function's
    # an island's (output, other input) positions in `ins` of names that may be one tensor: when
    # they are, its host version runs (a staged program's output is a new array, so the other
    # name would no longer be that tensor on paths that leave the output unchanged)
    aliased: tuple[tuple[int, int], ...] = ()
    live_after: frozenset[str] | None = None  # names read after the region (None: not known)
    # outputs that are also inputs and that the region never rebinds, only changes in place: a
    # list or dict among them keeps its identity (appends.kept_in_place)
    in_place: frozenset[str] = frozenset()
    # names that may hold a tensor a statement outside the region, from its first line on (inside
    # a host loop, anywhere), updates in place (None: any); a part's output that is a view of
    # another live name is refused where one of them is in it or in a later statement's `updates`
    # (the part's own updates are in its program's outputs)
    updated_later: frozenset[str] | None = None
    # of them, the containers whose elements may be updated in place (`xs[0].add_(1)`): a list or
    # dict holding a view is changed by `d[k] = v` / `xs.append(v)` without touching the view
    deep_later: frozenset[str] | None = None
    # a chunked loop with the statements before it (converters/dispatch_split.py): the names its
    # later chunks take, which run the loop alone (rewrite/chunks.py); None: the loop alone
    resume: tuple[str, ...] | None = None
    loop_line: int = 0  # (chunked) the loop's line (`line` is the first statement's)
    # (chunked) the simple statements after the loop, which each chunk runs once per exit
    after: tuple[StatementSpec, ...] = ()

    @property
    def label(self) -> str:
        # a tail island's host version may hold an island starting on the same line
        return f"{'tail island' if self.tail else self.kind}@{os.path.basename(self.file)}:{self.line}"

    @property
    def location(self) -> Location:
        return Location(self.file, self.line, self.statements[0].code if self.statements else "")


class Executor(Protocol):
    def run_region(self, spec: RegionSpec, fns: Sequence[Callable], values: tuple) -> tuple: ...

    def run_island(self, spec: RegionSpec, fn: Callable, values: tuple) -> Any: ...

    def run_chunked(self, spec: RegionSpec, fn: Callable, values: tuple, resume: Callable | None = None,
                    after: tuple[Callable, ...] = ()) -> Any: ...

    def truth(self, value: Any) -> bool: ...

    sites_read: set[str]  # the labels of the sites whose decisions it has read (for the report)


class _NotStaged:
    def __repr__(self) -> str:
        return "NOT_STAGED"


NOT_STAGED = _NotStaged()  # an island that did not stage: its host version runs instead
_PLAIN_ISLANDS: contextvars.ContextVar[frozenset | None] = contextvars.ContextVar("dycl_plain_islands", default=None)


_EXECUTOR: contextvars.ContextVar[Executor | None] = contextvars.ContextVar("dycl_executor", default=None)
EXECUTOR = _EXECUTOR  # set directly by the dispatch host's per-call context (one context for all it sets)
_DECISIONS: contextvars.ContextVar[list | None] = contextvars.ContextVar("dycl_host_decisions", default=None)
_MARGINS: contextvars.ContextVar[dict] = contextvars.ContextVar("dycl_host_margins", default={})


class executing:
    """Regions run through `executor` while active (None: plain Python, e.g. inside a host
    statement). A class, not a generator: the dispatch host enters it on every call."""

    __slots__ = ("executor", "token")

    def __init__(self, executor: Executor | None) -> None:
        self.executor = executor

    def __enter__(self) -> None:
        self.token = _EXECUTOR.set(self.executor)

    def __exit__(self, *exc: object) -> None:
        _EXECUTOR.reset(self.token)


@contextlib.contextmanager
def recording_decisions() -> Iterator[list[Decision]]:
    """Collect (site label, value) for every host decision at a data-dependent site, with the
    margin of a predicate a compiled region computed (see `note_margin`), and the decisions made
    inside compiled regions and islands (`record_compiled`), in program order."""
    decisions: list[Decision] = []
    token, margins, previous = _DECISIONS.set(decisions), _MARGINS.set({}), _Log.decisions
    _Log.decisions = decisions
    try:
        yield decisions
    finally:
        _DECISIONS.reset(token)
        _MARGINS.reset(margins)
        _Log.decisions = previous


def run_statements(spec: RegionSpec, fns: Sequence[Callable], values: Sequence[Any], ins: Sequence[str],
                   outs: Sequence[str], first: int = 0) -> tuple:
    """Run statements `fns` (from index `first` of the region) as plain Python over a name environment."""
    env = dict(zip(ins, values))
    for st, fn in zip(spec.statements[first:first + len(fns)], fns):
        env.update(zip(st.outs, fn(*[env[n] for n in st.ins])))
    return tuple(env[n] for n in outs)


def region(spec: RegionSpec, fns: Sequence[Callable], values: tuple) -> tuple:
    """Generated code's call of a region: `outs = region(spec, statement functions, ins)`."""
    executor = _EXECUTOR.get()
    if executor is None:
        return run_statements(spec, fns, values, spec.ins, spec.outs)
    return executor.run_region(spec, fns, values)


def island(spec: RegionSpec, fn: Callable, values: tuple) -> Any:
    """Generated code's call of a staged island: its outputs, or NOT_STAGED."""
    executor = _EXECUTOR.get()
    if executor is not None:
        return executor.run_island(spec, fn, values)
    on_host = _replayed_choice(spec)
    if on_host is None:  # no host choice to replay: mirror a host where this island did not stage
        hosted = _PLAIN_ISLANDS.get()
        on_host = hosted is not None and spec.label in hosted or \
            bool(spec.aliased or spec.in_place) and aliased_at_call(spec, values)
    if on_host:
        return NOT_STAGED
    decisions = _DECISIONS.get()
    if decisions is not None:  # the decisions the staged island makes, as the rewritten program's trace has them
        with modes.tracing(decisions):
            return fn(*values)
    return fn(*values)  # plain Python: the staged rewrite runs Python semantics


def chunked(spec: RegionSpec, fn: Callable, values: tuple, resume: Callable | None = None,
            after: tuple[Callable, ...] = ()) -> Any:
    """Generated code's call of a loop run in chunks of iterations (rewrite/chunks.py): the loop's
    outputs, or NOT_STAGED, where its host version runs (always without a dispatch host: it is
    the loop as written, which gives what the chunks give). With statements before the loop in
    `fn`, `resume` is the loop alone, which the later chunks run (`RegionSpec.resume`); `after`
    the functions of the statements after the loop (`RegionSpec.after`)."""
    executor = _EXECUTOR.get()
    return executor.run_chunked(spec, fn, values, resume, after) if executor is not None else NOT_STAGED


def aliased_at_call(spec: RegionSpec, values: tuple) -> bool:
    """Whether two of an island's names that may be one tensor are one at this call: then its
    host version runs (a staged program's outputs are new arrays, which would part them)."""
    # (and where one list or dict it changes in place is two of its inputs: one object inside it)
    return any(values[i] is values[j] for i, j in spec.aliased) or bool(spec.in_place and shared_containers(values))


AliasChoice = tuple[str, bool]  # (island label, whether its host version ran: aliasing, new int values)
_ALIAS_REPLAY: contextvars.ContextVar[list | None] = contextvars.ContextVar("dycl_alias_replay", default=None)


def _replayed_choice(spec: RegionSpec) -> bool | None:
    """Without an executor: whether the island's host version ran at this call on the dispatch
    host being replayed, or None (no replay, or the runs took different paths). The host's choice
    wins over its set of failed islands, whose labels two islands may share (an island and the
    one inside its host version), and over aliasing here (identity of JAX arrays on the host and
    of tensors here need not agree; an island specialised to its int values runs its host
    version on their first sight)."""
    replay = _ALIAS_REPLAY.get()
    if replay:
        label, on_host = replay[0]
        if label == spec.label:  # (another island first: the runs took different paths)
            del replay[0]
            return on_host
    return None


@contextlib.contextmanager
def replaying_alias_choices(choices: Sequence[AliasChoice]) -> Iterator[None]:
    """Without an executor, aliased islands take the choices a dispatch host made, in call order."""
    token = _ALIAS_REPLAY.set(list(choices))
    try:
        yield
    finally:
        _ALIAS_REPLAY.reset(token)


@contextlib.contextmanager
def islands_on_host(labels: frozenset) -> Iterator[None]:
    """Without an executor, run these islands' host versions (to mirror a dispatch host)."""
    token = _PLAIN_ISLANDS.set(labels)
    try:
        yield
    finally:
        _PLAIN_ISLANDS.reset(token)


def defined(value: Any) -> Any:
    """A value the host returns: an unassigned name fails here, as it would have in Python
    (`return y` or `return y, x`)."""
    if isinstance(value, Undefined):
        value._fail()
    if type(value) is tuple:
        for v in value:
            if isinstance(v, Undefined):
                v._fail()
    return value


def decide(value: Any, site: Site) -> bool:
    """A host decision at a data-dependent site: reads the value, records it when tracing."""
    executor = _EXECUTOR.get()
    if executor is None:
        taken = bool(value)
    else:
        taken = executor.truth(value)
        executor.sites_read.add(site.label)
    decisions = _DECISIONS.get()
    if decisions is not None:
        decisions.append(Decision(site.label, taken, _MARGINS.get().get(id(value), (None, math.nan))[1]))
    return taken


class _Log:
    """The decision list being recorded, for callbacks from compiled programs (JAX may run them on
    its own threads, where context variables do not reach; dispatch calls hold one lock)."""

    decisions: list | None = None


def record_compiled(site: str, value: Any, margin: float) -> None:
    """A decision made inside a compiled region or island (its lowered cond / while reports it)."""
    if _Log.decisions is not None:
        _Log.decisions.append(Decision(site, value, margin))


def note_margin(value: Any, margin: float) -> None:
    """While recording decisions: `value` (a predicate a region computed) is `margin` from flipping.
    (Keyed by identity: the value is kept alive with it, so its id is not reused meanwhile.)"""
    if _DECISIONS.get() is not None:
        _MARGINS.get()[id(value)] = (value, margin)


def recording_margins() -> bool:
    return _DECISIONS.get() is not None
