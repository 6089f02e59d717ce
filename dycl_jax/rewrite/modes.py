"""Operator modes: plain Python, staging (graph ops under torch.export), tracing (eager,
recording decisions), and dry runs (shapes only, used to plan branch outputs)."""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator, TypeVar

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

from dycl_jax.rewrite import constants
from dycl_jax.rewrite.minmax import python_builtins
from dycl_jax.rewrite.sites import Site


# Operator modes, constant tracking and state lifting are process-wide while torch.export or a
# rewritten program runs (torch.export itself keeps global state too), so everything that runs
# rewritten code takes this lock: conversions, dispatch-host calls (they capture lazily) and
# the eager traces. Calls of staged models run only jitted JAX code and need no lock.
_LOCK = threading.RLock()
_F = TypeVar("_F", bound=Callable[..., Any])


def exclusive(fn: _F) -> _F:
    """Run `fn` holding the lock that guards the rewrite's process-wide modes."""
    @functools.wraps(fn)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return fn(*args, **kwargs)
    return locked  # type: ignore[return-value]


class _State:
    arguments: frozenset = frozenset()  # ids of the tensors the caller passed to the traced method
    staging = 0
    dry = 0
    decisions: list[tuple[str, Any]] | None = None
    # (site, names) per tensor-decided loop whose Python counters became tensors, since the
    # outermost staging began: where a later `int(...)` of one fails, that loop is the cause
    promoted: list[tuple[Site, tuple[str, ...]]] = []
    decided: list[Site] = []  # tensor-decided constructs staged, in order (the cause `promoted` names)
    # whether the code running now runs at all (a padded program computes iterations after
    # the one its loop stopped in): None (always), a 0-d bool tensor, or INSIDE_COND
    reach: Any = None


_S = _State()


def _control_flow_ops() -> list[Any]:
    return [torch.ops.higher_order.cond, torch.ops.higher_order.while_loop, torch.ops.dycl.decided.default]


# ---------------------------------------------------------------- reach (padded programs)

@torch.library.custom_op("dycl::decided", mutates_args=())
def _decided(pred: torch.Tensor, reach: torch.Tensor, site: str) -> torch.Tensor:
    """`pred`, the decision at `site`, taken only where `reach` is true: the lowering records it
    then (lower/ops/control_flow.py). A padded program computes both paths of its exits (a
    select), so no cond records their decisions, and iterations nobody reaches decide nothing."""
    return pred.clone()


@_decided.register_fake
def _decided_fake(pred: torch.Tensor, reach: torch.Tensor, site: str) -> torch.Tensor:
    return torch.empty_like(pred)


# the reach inside a cond's branch in a padded program: the cond runs whether or not it is
# reached, so graph constructs nested in it cannot say which of their decisions count
INSIDE_COND = object()


def reach() -> Any:
    """Where the code running now runs at all: None (always), a 0-d bool tensor, or INSIDE_COND."""
    return _S.reach


@contextlib.contextmanager
def reached(r: Any) -> Iterator[None]:
    """Run the block with reach `r` (see `reach`)."""
    previous = _S.reach
    _S.reach = r
    try:
        yield
    finally:
        _S.reach = previous


def decided(pred: torch.Tensor, r: torch.Tensor, label: str) -> torch.Tensor:
    """`pred` through the `dycl::decided` op (staging only)."""
    return torch.ops.dycl.decided(pred, r, label)


def _unreached() -> bool:
    r = _S.reach
    return isinstance(r, torch.Tensor) and not bool(r)


@contextlib.contextmanager
def staging() -> Iterator[None]:
    """Tensor predicates emit torch.cond / torch.while_loop (enter around torch.export and its
    decompositions).

    While staging, dead-code elimination keeps control-flow nodes whose outputs are unused
    (e.g. a `break` test in a loop's last iteration): the staged program makes every decision
    the rewritten eager program makes, so their decision traces agree. XLA still drops such
    a cond from the plain (untraced) program, where nothing observes it.
    """
    from torch.fx.node import _side_effectful_functions

    added = [op for op in _control_flow_ops() if op not in _side_effectful_functions] if not _S.staging else []
    if not _S.staging:
        _S.promoted, _S.decided = [], []
    _side_effectful_functions.update(added)
    _S.staging += 1
    try:
        yield
    finally:
        _S.staging -= 1
        _side_effectful_functions.difference_update(added)


def note_decided(site: Site) -> None:
    """A construct at `site` is staged with a tensor predicate."""
    _S.decided.append(site)


def decided_mark() -> int:
    """How many constructs `note_decided` has seen: a mark for `decided_since`."""
    return len(_S.decided)


def decided_since(mark: int) -> list[Site]:
    """The constructs `note_decided` saw after the first `mark` of them (those of a loop body)."""
    return _S.decided[mark:]


def note_promoted(site: Site, names: tuple[str, ...]) -> None:
    """A staged loop at `site` carries the Python values `names` as tensors (their value now
    depends on how many times a tensor test let the loop run, or on the test that breaks out of
    it: `site` is that test where the loop's own test is a constant, `while True`)."""
    if names:
        _S.promoted.append((site, names))


def promoted() -> list[tuple[Site, tuple[str, ...]]]:
    """The loops `note_promoted` saw since the outermost staging began (the last conversion's)."""
    return list(_S.promoted)


@contextlib.contextmanager
def tracing(into: list | None = None) -> Iterator[list[tuple[str, Any]]]:
    """Record the decisions taken in eager mode: (site, bool) per if, (site, index) per switch,
    one (site, bool) per evaluation of a dynamic loop's condition (appended to `into` if given)."""
    previous = _S.decisions
    _S.decisions = decisions = [] if into is None else into
    try:
        with constants.tracked():  # constant-built tensors: decided while tracing, as when staged
            yield decisions
    finally:
        _S.decisions = previous


@contextlib.contextmanager
def caller_tensors(tensors: Any) -> Iterator[None]:
    """Mark the tensors the caller passed in while their method is traced: torch would update
    them in place for the caller, which no converted program can (operators check this)."""
    previous = _S.arguments
    _S.arguments = frozenset(id(t) for t in tensors)
    try:
        yield
    finally:
        _S.arguments = previous


def is_caller_tensor(t: Any) -> bool:
    return id(t) in _S.arguments


def current() -> str:
    """"dry" | "staging" | "tracing" | "plain" (innermost first)."""
    if _S.dry:
        return "dry"
    if _S.staging:
        return "staging"
    return "tracing" if _S.decisions is not None else "plain"


@contextlib.contextmanager
def unrecorded() -> Iterator[None]:
    """Decisions made in the block are not kept (the code still runs as traced): a construct
    the staged program holds no op for (no outputs) makes none of its nested decisions there."""
    previous = _S.decisions
    if previous is not None:
        _S.decisions = []
    try:
        yield
    finally:
        _S.decisions = previous


def record(site: Site, value: Any) -> None:
    if _S.decisions is not None and site.kind != "guard" and not _unreached():
        _S.decisions.append((site.label, value))


@contextlib.contextmanager
def dry_run(values: Any) -> Iterator[Any]:
    """Run code for shapes only: on fake tensors, without recording graph nodes."""
    if _S.dry:
        yield values
        return
    _S.dry += 1
    try:
        if _S.staging:
            with disable_proxy_modes_tracing():
                yield values
        else:
            mode = FakeTensorMode(allow_non_fake_inputs=True)
            fakes = pytree.tree_map_only(torch.Tensor, lambda t: constants.fake(mode, t), values)
            with mode, torch.no_grad(), python_builtins():  # max/min of fake tensors, as staged
                yield fakes
    finally:
        _S.dry -= 1
