"""`to_jax`: runs the pipeline stages in order on one model method."""
from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import time
import warnings
from typing import Any, Callable, Iterator

import jax
import torch
import torch.utils._pytree as pytree
from flax import nnx
from torch.nn.modules.batchnorm import _BatchNorm

import dycl_jax.lower.ops  # noqa: F401  (registers every lowering)
from dycl_jax.capture import host_rng
from dycl_jax.capture.carried_state import check_no_carried_state
from dycl_jax.capture.export import StateEntry, TensorSpec, _leaf_names, capture
from dycl_jax.errors import (AliasedUpdateError, DyclError, InputMutationError, PathMismatchError, StagedAliasError,
                             UnsupportedOpError, exception_chain, provoked_by_us)
from dycl_jax.emit.writer import EmitInput
from dycl_jax.host.dispatch import DispatchHost
from dycl_jax.host.select import HOSTS, dispatch_reason, internal_cause, noted, staged_refusal, user_location
from dycl_jax.host.staged import keyed_fn, staged_fn
from dycl_jax.lower.int_ranges import describe_ints, int64_verdict, int_scope
from dycl_jax.lower.interpreter import LoweredGraph
from dycl_jax.lower.reroll import reroll
from dycl_jax.report.build import build_report
from dycl_jax.report.dispatch import build_dispatch_report
from dycl_jax.rewrite.api import UnrollOption, dispatch_plan, rewritten, staging
from dycl_jax.rewrite.modes import exclusive
from dycl_jax.rewrite import rows
from dycl_jax.runtime.attribute_guard import guard_for
from dycl_jax.runtime.decoded import finish
from dycl_jax.runtime.model import JaxModel
from dycl_jax.runtime.signature import CallSignature
from dycl_jax.runtime.training import TrainingJaxModel
from dycl_jax.runtime.state import build_module, canonical_paths, stack_groups


def _collector_paused(fn: Callable) -> Callable:
    """Run `fn` with Python's cyclic garbage collector paused (its prior state restored after).

    A conversion allocates millions of objects (fx nodes, fake tensors, traced frames) and keeps
    most of them until it ends, so each full collection rescans them all for almost nothing
    (ResNet-110 BlockDrop: five full collections, about 1 CPU-s of an 11 s conversion). The
    cycles it leaves are collected as usual once the collector runs again."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()
    return run


@exclusive
@_collector_paused
def to_jax(
    model: torch.nn.Module,
    example_args: Any,
    *,
    method: str = "forward",
    host: str = "auto",
    dynamic_batch: bool = True,
    max_len: int | None = None,
    train: bool = False,
    rngs: nnx.Rngs | None = None,
    progress: Callable[[str], None] | None = None,
) -> JaxModel:
    """Convert `model.<method>` to JAX. Non-tensor leaves of `example_args` are baked in.

    host: "staged" (one XLA program), "dispatch" (control flow in Python around jitted
    regions, exact for data-dependent shapes) or "auto" (staged if the whole method stages,
    else dispatch). `progress`, if given, is called with the name of each stage as it starts.

    max_len: where the method does not stage as written, unroll its decode loop (a loop whose
    values change shape per iteration, at the top level of the method) into one staged program
    of at most `max_len` iterations; its outputs come back exact from `jm(...)` and padded,
    with their lengths, from `jm.padded(...)` / `jm.apply(...)` (see README, "Staged decode loops").

    train: convert the method as `model.train()` runs it (BatchNorm on batch statistics,
    updating its running statistics; dropout and other random ops on): a `TrainingJaxModel`
    (runtime/training.py) whose calls take `key=` (else draw from `rngs`, default
    `nnx.Rngs(0)`). With `host="auto"` a method that does not stage runs on the dispatch host,
    each region on batch statistics writing its updates into the state as it runs.
    """
    with _generators_kept():
        jm = _to_jax(model, example_args, method, host, dynamic_batch, max_len, train, rngs, progress)
    jm.signature.guard = guard_for(model)  # a call after an attribute it holds changed is refused
    return jm


@contextlib.contextmanager
def _generators_kept() -> Iterator[None]:
    """Converting runs the model (and the converted host) on the example: whatever that draws from
    torch's, Python's or numpy's global generator is put back, so a conversion moves no random
    stream of the caller's."""
    generators = host_rng.state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            host_rng.restore(generators)


def _to_jax(model: torch.nn.Module, example_args: Any, method: str, host: str, dynamic_batch: bool,
            max_len: int | None, train: bool, rngs: nnx.Rngs | None,
            progress: Callable[[str], None] | None) -> JaxModel:
    step = progress or (lambda stage: None)
    if not isinstance(model, torch.nn.Module):
        raise DyclError(f"to_jax expects a torch.nn.Module, got {type(model).__name__}")
    if host not in HOSTS:
        raise DyclError(f"unknown host {host!r}", fix=f"use one of {', '.join(HOSTS)}")
    if max_len is not None and (type(max_len) is not int or max_len < 1):
        raise DyclError(f"max_len must be a positive int, got {max_len!r}", fix="pass e.g. max_len=32")
    args = example_args if isinstance(example_args, tuple) else (example_args,)
    if train:
        jm = _training(model, args, method, host, dynamic_batch, max_len, rngs, step)
        jm.source = model_source(model, method)
        return jm
    check_no_carried_state(model, args, method)  # attributes kept across calls: no host keeps them
    reason = where = None
    start = time.perf_counter()
    if host != "dispatch":
        try:
            try:
                return _staged(model, args, method, dynamic_batch, step)
            except (UnsupportedOpError, InputMutationError, AliasedUpdateError):
                raise
            except DyclError as first:
                if max_len is None:
                    if internal_cause(first) is not None or not _path_mismatch(first):
                        raise
                    return _padded(model, args, method, dynamic_batch, step, first, time.perf_counter() - start)
            # as written the method does not stage: with its decode loop unrolled it may
            return _staged(model, args, method, dynamic_batch, step, UnrollOption(max_len))
        except DyclError as exc:  # the method does not stage as one program (our own bugs propagate)
            internal = internal_cause(exc)
            if internal is not None:
                raise internal from None  # our own bug (or torch failing on a call of ours) under a DyclError
            if _same_under_either_host(exc):
                raise  # a refusal the dispatch host would give too
            if host == "staged":
                raise staged_refusal(exc) from exc
            reason = dispatch_reason(exc)
            where = exc.location or user_location(exc)
        except Exception as exc:  # not a refusal: our own bug (told to report it) or the user's error, as itself
            if provoked_by_us(exc) is not None:
                noted(exc)
            raise
    jm = _dispatch(model, args, method, step, reason, time.perf_counter() - start)
    jm.dispatch_location = where
    jm.source = model_source(model, method)
    return jm


# the iterations a decode loop may take in auto's padded program (`_padded`): a loop that its own
# test ends within them stages; one that may run longer goes to the dispatch host
AUTO_UNROLL = 16


def _path_mismatch(exc: DyclError) -> bool:
    """Whether `exc` refuses values that differ between paths (in shape, structure, Python value)."""
    return any(isinstance(e, PathMismatchError) for e in exception_chain(exc))


def _padded(model: torch.nn.Module, args: tuple, method: str, dynamic_batch: bool, step: Callable[[str], None],
            first: DyclError, attempt_s: float) -> JaxModel:
    """The method staged as one padded program (padding.py): its decode loop unrolled to its own
    bound (at most AUTO_UNROLL iterations), its return value padded where paths differ in shape,
    and every call trimmed to the exact result. Where that is refused too, `first` (the method's
    refusal as written) is raised: what the dispatch host's reason names."""
    try:
        jm = _staged(model, args, method, dynamic_batch, step, UnrollOption(AUTO_UNROLL, natural=True))
    except DyclError as exc:
        internal = internal_cause(exc)
        if internal is not None:
            raise internal from None
        raise first from None
    assert jm._report is not None
    jm._report.padded_reason = dispatch_reason(first)
    jm._report.timings["staged_attempt_s"] = attempt_s
    return jm


def _same_under_either_host(exc: DyclError) -> bool:
    """A missing lowering, or an update the dispatch host could not keep either: no fallback.
    (A staged construct's alias refusal is answered by the dispatch host, which runs it in Python.)"""
    return isinstance(exc, (UnsupportedOpError, InputMutationError, AliasedUpdateError)) \
        and not isinstance(exc, StagedAliasError)


def _staged(model: torch.nn.Module, args: tuple, method: str, dynamic_batch: bool,
            step: Callable[[str], None], unroll: UnrollOption | None = None) -> JaxModel:
    t0, c0 = time.perf_counter(), time.process_time()
    # The rewritten method (and every user method it reaches) is patched in only while
    # torch.export runs; staging() makes tensor predicates emit torch.cond/while_loop.
    step("rewrite + capture" if unroll is None else "rewrite (paths padded, loops unrolled to their own bound) + capture"
         if unroll.natural else f"rewrite (decode loop unrolled, max_len={unroll.max_len}) + capture")
    with contextlib.ExitStack() as patched:
        rewrite_record = patched.enter_context(rewritten(model, method, unroll))
        t_rewrite, c_rewrite = time.perf_counter(), time.process_time()
        patched.enter_context(staging())
        patched.enter_context(rows.dense())  # row selections as masked dense computations
        cap = capture(model, args, method, dynamic_batch=dynamic_batch)
    t1, c1 = time.perf_counter(), time.process_time()
    step("lower")
    # int64 stays int32 unless some int64 value may leave int32; then the program is built and
    # run inside JAX's 64-bit scope (see lower/dtypes.py)
    ints = int64_verdict(cap.ep.graph_module, [e.tensor for e in cap.state])
    with int_scope(ints.wide):
        graph = LoweredGraph.build(cap.ep.graph_module, name=f"{type(model).__name__}.{method}")
        module, variables = build_module(cap.state)
        program, variables, value_paths = _rerolled(graph, module, variables, [e.path for e in cap.state])
        t2, c2 = time.perf_counter(), time.process_time()
        jm = JaxModel(module, variables, canonical_paths(module, variables), staged_fn(program), CallSignature.of(cap),
                      "staged", x64=ints.wide, finish=finish if unroll is not None else None,
                      value_paths=value_paths)
        step("check")
        # Trace once on the example's shapes (no compile, no compute): every lowering and every
        # branch-shape check runs now, so problems surface at conversion rather than first call.
        jax.eval_shape(jm._fn, jm._state_values(), jm.signature.bind(args))
    t3, c3 = time.perf_counter(), time.process_time()
    timings = {"rewrite_s": t_rewrite - t0, "export_s": cap.export_seconds, "decompose_s": cap.decompose_seconds,
               "capture_s": t1 - t_rewrite, "lower_s": t2 - t1, "check_s": t3 - t2,
               # CPU seconds of the process: steadier than wall time on a shared machine
               "rewrite_cpu_s": c_rewrite - c0, "export_cpu_s": cap.export_cpu_seconds,
               "decompose_cpu_s": cap.decompose_cpu_seconds, "capture_cpu_s": c1 - c_rewrite, "lower_cpu_s": c2 - c1,
               "check_cpu_s": c3 - c2}
    jm.unroll = unroll
    jm._report = build_report(type(model).__name__, method, jm.host, cap, graph, timings, rewrite_record)
    jm._report.integers = describe_ints(ints)
    jm.source = model_source(model, method)
    jm._emit_input = _emit_input(model, cap, ints.wide)
    return jm


def _emit_input(model: torch.nn.Module, cap: Any, x64: bool) -> EmitInput:
    """What emission needs, without the weights: emit() reads them from the JAX state (trained
    values included), and the JaxModel must not keep the torch parameters alive."""
    return EmitInput(_graph_only(cap.ep), {e.path: e.tensor.detach().to("meta") for e in cap.state},
                     {p: type(m) for p, m in model.named_modules(remove_duplicate=False)},
                     [s.name for s in cap.inputs], cap.out_spec, type(model).__name__, x64,
                     tuple(cap.mutations), frozenset(e.path for e in cap.state if e.kind == "param"))


def _rerolled(graph: LoweredGraph, module: Any, variables: list, paths: list[str]) -> tuple[Any, list, list[str]]:
    """The program with its runs of identical gated blocks as scans over their stacked state
    (lower/reroll.py), its variables (each stacked role once) and the torch path of each kept one."""
    program = reroll(graph, len(variables))
    stacked = None
    if program is not None:
        index = {p: k for k, p in enumerate(graph.placeholders)}
        stacked = stack_groups(module, variables, paths, [[index[p] for p in g] for g in program.groups])
    if program is None or stacked is None:
        return graph, variables, paths
    return program, stacked, [paths[k] for k in program.kept] + [""] * len(program.groups)


def _graph_only(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """`ep` with its parameters, buffers and constants replaced by meta tensors (shape and dtype only)."""
    meta = lambda v: v.detach().to("meta") if isinstance(v, torch.Tensor) else v  # noqa: E731
    ep._state_dict = {k: meta(v) for k, v in ep.state_dict.items()}
    ep._constants = {k: meta(v) for k, v in ep.constants.items()}
    return ep


def model_source(model: torch.nn.Module, method: str) -> dict[str, Any]:
    """The converted model's class, method and file (for an exported artifact's manifest)."""
    cls = type(model)
    try:
        file = inspect.getsourcefile(cls)
    except TypeError:  # a class defined where no file holds it
        file = None
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "method": method, "file": file}


def _training(model: torch.nn.Module, args: tuple, method: str, host: str, dynamic_batch: bool,
              max_len: int | None, rngs: nnx.Rngs | None, step: Callable[[str], None]) -> TrainingJaxModel:
    if max_len is not None:
        raise DyclError("train=True does not unroll decode loops: max_len is not supported with it",
                        fix='drop max_len: with host="auto" (the default) a decode loop runs on the dispatch host')
    if host == "dispatch":
        return _dispatch(model, args, method, step, None, 0.0, train=True, rngs=rngs)
    start = time.perf_counter()
    step("rewrite + capture (train mode)")
    try:
        with rewritten(model, method) as rewrite_record, staging():
            cap = capture(model, args, method, dynamic_batch=dynamic_batch, train=True)
    except DyclError as exc:
        internal = internal_cause(exc)
        if internal is not None:
            raise internal from None
        if _same_under_either_host(exc):
            raise
        if host == "staged":
            raise staged_refusal(exc) from exc
        jm = _dispatch(model, args, method, step, dispatch_reason(exc), time.perf_counter() - start,
                       train=True, rngs=rngs)
        jm.dispatch_location = exc.location or user_location(exc)
        return jm
    step("lower")
    ints = int64_verdict(cap.ep.graph_module, [e.tensor for e in cap.state])
    updated = set(cap.mutations)
    # by tensor: a buffer held under two names is one variable, updated whichever name it has
    mutated = {id(e.tensor) for e in cap.state if e.path in updated}
    entries = [StateEntry(e.path, "batch_stat", e.tensor) if id(e.tensor) in mutated else e for e in cap.state]
    with int_scope(ints.wide):
        graph = LoweredGraph.build(cap.ep.graph_module, name=f"{type(model).__name__}.{method}")
        module, variables = build_module(entries)
        paths = canonical_paths(module, variables)
        updated = [paths[[e.path for e in entries].index(p)] for p in cap.mutations]
        jm = TrainingJaxModel(module, variables, paths, keyed_fn(graph, len(cap.mutations)),
                              CallSignature.of(cap), updated, rngs or nnx.Rngs(0), x64=ints.wide)
        step("check")
        jax.eval_shape(jm._fn, jm._state_values(), jm.signature.bind(args), jax.random.key(0))
    jm._report = build_report(type(model).__name__, method, jm.host, cap, graph, {}, rewrite_record)
    jm._report.integers = describe_ints(ints)
    jm._emit_input = _emit_input(model, cap, ints.wide)  # a train-mode module, keys and statistics
    return jm


def _dispatch(model: torch.nn.Module, args: tuple, method: str, step: Callable[[str], None],
              reason: str | None, staged_attempt_s: float, train: bool = False,
              rngs: nnx.Rngs | None = None) -> JaxModel:
    t0 = time.perf_counter()
    step("rewrite (dispatch)" if not train else "rewrite (dispatch, train mode)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the staged attempt (or its absence) already warned once
        plan = dispatch_plan(model, method)
    entries = [StateEntry(p, "param", t.detach()) for p, t in model.named_parameters()]
    stats = _batch_stats(model) if train else set()
    entries += [StateEntry(p, "batch_stat" if p in stats else "buffer", t) for p, t in model.named_buffers()]
    module, variables = build_module(entries)
    paths = [e.path for e in entries]
    leaves, spec = pytree.tree_flatten(args)
    index = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    names = _leaf_names(model, method, args)
    # shapes may change from call to call: the host compiles each signature it meets
    inputs = [TensorSpec(names[i], (None,) * leaves[i].dim(), leaves[i].dtype) for i in index]
    signature = CallSignature(inputs, spec, leaves, index, pytree.tree_structure(0))
    dispatch = DispatchHost(model, method, plan, paths, leaves, spec, index, train=train)
    t1 = time.perf_counter()
    step("compile the example's path")
    if train:
        # every buffer comes back: which of them a call updates depends on its path
        updated = [i for i, e in enumerate(entries) if e.kind != "param"]
        call = functools.partial(dispatch.train_call, updated=updated)
        jm: JaxModel = TrainingJaxModel(module, variables, paths, call, signature, [paths[i] for i in updated],
                                        rngs or nnx.Rngs(0), host="dispatch")
        # regions on the example's path are captured and compiled now (its statistics not kept)
        jm._fn(jm._state_values(), signature.bind(args), jax.random.key(0))
    else:
        jm = JaxModel(module, variables, paths, dispatch, signature, "dispatch", jit=False, structured=True)
        was_training = model.training
        model.eval()
        try:
            jm(*args)  # regions on the example's path are captured and compiled now; others on first use
        finally:
            model.train(was_training)
    t2 = time.perf_counter()
    timings = {"rewrite_s": t1 - t0, "example_path_s": t2 - t1}
    if reason is not None:
        timings["staged_attempt_s"] = staged_attempt_s
    jm._report_builder = lambda: build_dispatch_report(type(model).__name__, method, dispatch, jm.signature,
                                                       entries, timings, plan.record, reason)
    return jm


def _batch_stats(model: torch.nn.Module) -> set[str]:
    """Paths of the BatchNorm statistics (`nnx.BatchStat` in a train=True conversion)."""
    return {f"{name}.{b}" if name else b for name, m in model.named_modules() if isinstance(m, _BatchNorm)
            for b, _ in m.named_buffers(recurse=False)}
