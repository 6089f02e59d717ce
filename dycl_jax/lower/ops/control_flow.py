"""torch.cond / torch.while_loop → lax.cond / lax.while_loop, with optional decision tracing."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import torch
import torch.fx

from dycl_jax.errors import DyclError
from dycl_jax.lower.batching import batchable_cond
from dycl_jax.lower.decision_log import DecisionLog
from dycl_jax.lower.interpreter import (LoweredGraph, current_env, current_loop_bound, current_node, current_site,
                                       node_location)
from dycl_jax.lower.keys import current_stream, key_stream, next_key
from dycl_jax.lower.margins import margin
from dycl_jax.lower.registry import register
from dycl_jax.rewrite import modes  # noqa: F401  (registers the dycl::decided op lowered below)
from dycl_jax.source import origins

# While set, the lowerings below report each decision to this callback as (site, value, margin),
# the margin as lower/margins.py computes it from the predicate's graph (nan: none).
# It is read when JAX traces the program, so a traced program must be jitted separately.
# A `DecisionLog` instead of a callback makes the decisions values the program returns
# (lower/decision_log.py): conds and loops then thread the log through their operands.
Recorder = Callable[[str, Any, float], None] | DecisionLog
_RECORDER: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("dycl_recorder", default=None)


@contextlib.contextmanager
def recording(callback: Recorder) -> Iterator[None]:
    """Trace programs that report every branch decision and loop test to `callback`."""
    token = _RECORDER.set(callback)
    try:
        yield
    finally:
        _RECORDER.reset(token)


def is_recording() -> bool:
    """Whether programs traced now report their decisions (to a callback or a DecisionLog)."""
    return _RECORDER.get() is not None


_DIFFERENTIABLE: contextvars.ContextVar[bool] = contextvars.ContextVar("dycl_differentiable", default=False)


@contextlib.contextmanager
def differentiable() -> Iterator[None]:
    """Trace programs for reverse-mode AD: bounded while loops become fori_loop (a scan).

    lax.while_loop has no reverse-mode derivative. A loop whose trip count has a static bound
    runs as `bound` steps that each do the body only while the test holds; once the test is
    false the carry no longer changes, so the test stays false and the result is the same.
    """
    token = _DIFFERENTIABLE.set(True)
    try:
        yield
    finally:
        _DIFFERENTIABLE.reset(token)


# The rewrite stage stages an elif chain as nested torch.cond on a path index that every cond
# of the chain receives as operand 0 (`cond(idx == k, path k, rest of chain)`). A trace reports
# the chain once, as that index, like the torch side does; the inner conds stay silent.
_IN_CHAIN: contextvars.ContextVar[str | None] = contextvars.ContextVar("dycl_in_chain", default=None)


def _record(value: jax.Array, margin: Any = None, when: Any = None, site: str | None = None) -> None:
    """Report a decision at `site` (default: the node being lowered), only where `when` holds if given."""
    recorder = _RECORDER.get()
    if recorder is None:
        return
    site = current_site() if site is None else site
    m = jnp.asarray(jnp.nan if margin is None else margin, jnp.float32)
    if isinstance(recorder, DecisionLog):
        recorder.append(site, value, m, when)
        return
    # ordered=True keeps decisions in program order, also inside loops and branches
    if when is None:
        jax.debug.callback(lambda v, m: recorder(site, v.item(), m.item()), value, m, ordered=True)
    else:
        jax.debug.callback(lambda v, m, w: recorder(site, v.item(), m.item()) if w.item() else None,
                           value, m, jnp.asarray(when), ordered=True)


# ops between a `dycl::decided` node and the cond that takes its output as predicate
_VIEWS = frozenset({torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten.alias.default,
                    torch.ops.aten.clone.default, torch.ops.aten._to_copy.default})


def _marked(node: torch.fx.Node | None) -> bool:
    """Whether the cond `node` takes its predicate from `dycl::decided`, which records the decision."""
    arg = node.args[0] if node is not None and node.args else None
    while isinstance(arg, torch.fx.Node) and arg.op == "call_function" and arg.target in _VIEWS:
        arg = arg.args[0]
    return isinstance(arg, torch.fx.Node) and arg.op == "call_function" \
        and arg.target is torch.ops.dycl.decided.default


@register(torch.ops.dycl.decided.default)
def decided(pred: Any, reach: Any, site: str) -> jax.Array:
    """The predicate of a padded program's decision at `site` (rewrite/modes.py), recorded where reached."""
    if origins.is_decision(site):
        _record(_pred(pred), _pred_margin(), when=_pred(reach), site=site)
    return jnp.asarray(pred)


def _pred_margin(i: int = 0, j: int | None = None) -> Any:
    """The margin of argument i (its item j) of the control-flow node being lowered (while recording only)."""
    node, env = current_node(), current_env()
    if _RECORDER.get() is None or node is None or env is None:
        return None
    arg = node.args[i] if j is None else node.args[i][j]
    return margin(arg, env)


def _active_log() -> DecisionLog | None:
    recorder = _RECORDER.get()
    return recorder if isinstance(recorder, DecisionLog) and recorder.active else None


def _logged_cond(log: DecisionLog, p: Any, true_fn: Callable, false_fn: Callable, operands: tuple) -> Any:
    """lax.cond with the decision log as an extra operand and result of both branches; under
    `differentiable()` the batchable cond (`lower/batching.py`), so that a vmapped traced
    program logs each sample's decisions through the same vmap rule as `apply`'s."""
    def threaded(fn: Callable) -> Callable:
        def run(args: tuple) -> tuple:
            log.log, ops = args
            outs = fn(ops)
            return log.log, outs
        return run

    before = log.log
    n = len(before)

    def flat(fn: Callable) -> Callable:  # batchable_cond takes and gives flat arrays
        return lambda *a: (lambda r: (*r[0], *r[1]))(threaded(fn)((tuple(a[:n]), a[n:])))

    try:
        if _DIFFERENTIABLE.get():
            res = batchable_cond(p, flat(true_fn), flat(false_fn), (*before, *operands))
            log.log, outs = tuple(res[:n]), tuple(res[n:])
        else:
            log.log, outs = jax.lax.cond(p, threaded(true_fn), threaded(false_fn), (before, operands))
    except BaseException:
        log.log = before  # a branch's tracer must not outlive its trace
        raise
    return outs


def _logged_while(log: DecisionLog, test: Callable, body: Callable, carry0: tuple) -> tuple:
    """lax.while_loop with the decision log carried. A loop test cannot return values, so each
    test is recorded again where its outcome is known: at the start of the iteration it allowed
    (true) and after the loop on the final carry (false); the order is the callbacks' order."""
    def test_fn(c: tuple) -> Any:
        with log.muted():
            return test(c[1])

    def body_fn(c: tuple) -> tuple:
        log.log, carry = c
        test(carry)
        out = body(carry)
        return log.log, out

    before = log.log
    try:
        log.log, carry = jax.lax.while_loop(test_fn, body_fn, (before, carry0))
    except BaseException:
        log.log = before
        raise
    test(carry)
    return carry


def _pred(p: Any) -> jax.Array:
    p = jnp.asarray(p)
    if p.size != 1:
        raise DyclError(f"a branch predicate must have one element, got shape {p.shape}")
    return p.reshape(()).astype(bool)


def _origin(graph: LoweredGraph, i: int) -> str:
    outs = graph.output_node.args[0] if graph.output_node is not None else ()
    node = outs[i] if isinstance(outs, (list, tuple)) and i < len(outs) else None
    loc = node_location(node) if isinstance(node, torch.fx.Node) else None
    return f" (from {loc.file}:{loc.line})" if loc else ""


def _check_same(outs_t: Any, outs_f: Any, true_graph: LoweredGraph, false_graph: LoweredGraph) -> None:
    for i, (a, b) in enumerate(zip(outs_t, outs_f)):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise DyclError(
                f"branch output {i} is {a.dtype}{list(a.shape)} on the true branch{_origin(true_graph, i)} "
                f"but {b.dtype}{list(b.shape)} on the false branch{_origin(false_graph, i)}; "
                "a staged program needs both alike",
                fix="make both paths produce the same shape and dtype (e.g. pad), or use the dispatch host",
            )


@register(torch.ops.higher_order.cond)
def cond(pred: Any, true_graph: LoweredGraph, false_graph: LoweredGraph, operands: Any) -> tuple[Any, ...]:
    p = _pred(pred)
    operands = tuple(operands)
    site = current_site()
    chain = site.startswith("elif@")
    if not origins.is_decision(site) or _marked(current_node()):
        pass  # an internal exit-flag guard of the rewrite, not a user decision; or recorded by `decided`
    elif not chain:
        _record(p, _pred_margin())
    elif _IN_CHAIN.get() != site:
        # the chain's path index is operand 0; its margin is that of the tests computing it
        _record(jnp.asarray(operands[0]), _pred_margin(3, 0))
    token = _IN_CHAIN.set(site if chain else None)
    log = _active_log()
    try:
        if log is not None:
            return _logged_cond(log, p, lambda ops: true_graph(*ops), lambda ops: false_graph(*ops), operands)
        if _DIFFERENTIABLE.get() and _RECORDER.get() is None:  # apply(): what users vmap and differentiate
            return batchable_cond(p, lambda *ops: tuple(true_graph(*ops)), lambda *ops: tuple(false_graph(*ops)),
                                  operands)
        return jax.lax.cond(p, lambda ops: true_graph(*ops), lambda ops: false_graph(*ops), operands)
    except TypeError:
        # lax.cond refuses branches that differ in shape or dtype; say which output and where
        # (checked only on failure: tracing both branches up front again doubles trace time
        # with every level of nesting)
        with log.muted() if log is not None else contextlib.nullcontext():
            _explain_mismatch(true_graph, false_graph, operands)
        raise
    finally:
        _IN_CHAIN.reset(token)


def _explain_mismatch(true_graph: LoweredGraph, false_graph: LoweredGraph, operands: tuple) -> None:
    shapes_t = jax.eval_shape(lambda ops: true_graph(*ops), operands)
    shapes_f = jax.eval_shape(lambda ops: false_graph(*ops), operands)
    _check_same(shapes_t, shapes_f, true_graph, false_graph)


@register(torch.ops.higher_order.while_loop)
def while_loop(
    cond_graph: LoweredGraph, body_graph: LoweredGraph, carried: Any, additional: Any = ()
) -> tuple[Any, ...]:
    extra = tuple(additional)

    def test(carry: tuple[Any, ...], extra: tuple[Any, ...] = extra) -> jax.Array:
        if _RECORDER.get() is None:
            return _pred(cond_graph(*carry, *extra)[0])
        outs, margins = cond_graph.with_margins(*carry, *extra)
        p = _pred(outs[0])
        _record(p, margins[0])
        return p

    def body(carry: tuple[Any, ...], extra: tuple[Any, ...] = extra) -> tuple[Any, ...]:
        out = body_graph(*carry, *extra)
        # torch keeps carry dtypes fixed; JAX needs them bit-identical (weak types included)
        return tuple(jnp.asarray(o, dtype=c.dtype).reshape(c.shape) for o, c in zip(out, carry))

    carry0 = tuple(jnp.asarray(c) for c in carried)
    log = _active_log()
    if log is not None:
        return _logged_while(log, test, body, carry0)
    stream = current_stream()
    if stream is not None:  # random ops in the body: each iteration draws with a key of its own
        test, body, carry0 = _keyed(test, body, carry0, next_key("while_loop"), stream.drawn)
    bound = current_loop_bound()
    if bound is not None and _DIFFERENTIABLE.get() and _RECORDER.get() is None:
        n = len(carry0)

        def step(_: Any, c: tuple[Any, ...]) -> tuple[Any, ...]:
            if stream is not None:  # the keyed body takes its carry only
                return jax.lax.cond(test(c), body, lambda c: c, c)
            # the loop-invariant inputs go in as operands, so a vmap keeps them unbatched
            return batchable_cond(test(c), lambda *a: body(a[:n], a[n:]), lambda *a: tuple(a[:n]), (*c, *extra))

        out = jax.lax.fori_loop(0, bound, step, carry0)
    else:
        out = jax.lax.while_loop(test, body, carry0)
    return out[:-1] if stream is not None else out


def _keyed(test: Callable, body: Callable, carry0: tuple, key: Any,
           drawn: list[int]) -> tuple[Callable, Callable, tuple]:
    """The loop with its key as the last carry: the body draws from a fold of it, then moves it on."""

    def keyed_test(carry: tuple) -> jax.Array:
        return test(carry[:-1])

    def keyed_body(carry: tuple) -> tuple:
        k = carry[-1]
        with key_stream(jax.random.fold_in(k, 1), drawn):
            out = body(carry[:-1])
        return (*out, jax.random.fold_in(k, 0))

    return keyed_test, keyed_body, (*carry0, key)
