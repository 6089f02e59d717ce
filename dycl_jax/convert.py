"""`to_jax`: runs the pipeline stages in order on one model method."""
from __future__ import annotations

import contextlib
import time
import warnings
from typing import Any, Callable

import jax
import torch
import torch.utils._pytree as pytree

import dycl_jax.lower.ops  # noqa: F401  (registers every lowering)
from dycl_jax.capture.export import StateEntry, TensorSpec, _leaf_names, capture
from dycl_jax.errors import AliasedUpdateError, DyclError, InputMutationError, UnsupportedOpError
from dycl_jax.host.dispatch import DispatchHost
from dycl_jax.host.select import HOSTS, dispatch_reason, staged_refusal
from dycl_jax.host.staged import staged_fn
from dycl_jax.lower.int_ranges import describe_ints, int64_verdict, int_scope
from dycl_jax.lower.interpreter import LoweredGraph
from dycl_jax.report.build import build_report
from dycl_jax.report.dispatch import build_dispatch_report
from dycl_jax.rewrite.api import UnrollOption, dispatch_plan, rewritten, staging
from dycl_jax.rewrite.modes import exclusive
from dycl_jax.runtime.decoded import finish
from dycl_jax.runtime.model import JaxModel
from dycl_jax.runtime.signature import CallSignature
from dycl_jax.runtime.state import build_module


@exclusive
def to_jax(
    model: torch.nn.Module,
    example_args: Any,
    *,
    method: str = "forward",
    host: str = "auto",
    dynamic_batch: bool = True,
    max_len: int | None = None,
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
    """
    step = progress or (lambda stage: None)
    if not isinstance(model, torch.nn.Module):
        raise DyclError(f"to_jax expects a torch.nn.Module, got {type(model).__name__}")
    if host not in HOSTS:
        raise DyclError(f"unknown host {host!r}", fix=f"use one of {', '.join(HOSTS)}")
    if max_len is not None and (type(max_len) is not int or max_len < 1):
        raise DyclError(f"max_len must be a positive int, got {max_len!r}", fix="pass e.g. max_len=32")
    args = example_args if isinstance(example_args, tuple) else (example_args,)
    reason = None
    start = time.perf_counter()
    if host != "dispatch":
        try:
            try:
                return _staged(model, args, method, dynamic_batch, step)
            except (UnsupportedOpError, InputMutationError, AliasedUpdateError):
                raise
            except DyclError:
                if max_len is None:
                    raise
            # as written the method does not stage: with its decode loop unrolled it may
            return _staged(model, args, method, dynamic_batch, step, UnrollOption(max_len))
        except (UnsupportedOpError, InputMutationError, AliasedUpdateError):
            raise  # a missing lowering, or an update dispatch could not keep either, is the same under either host
        except DyclError as exc:  # the method does not stage as one program (our own bugs propagate)
            if host == "staged":
                raise staged_refusal(exc) from exc
            reason = dispatch_reason(exc)
    return _dispatch(model, args, method, step, reason, time.perf_counter() - start)


def _staged(model: torch.nn.Module, args: tuple, method: str, dynamic_batch: bool,
            step: Callable[[str], None], unroll: UnrollOption | None = None) -> JaxModel:
    t0 = time.perf_counter()
    # The rewritten method (and every user method it reaches) is patched in only while
    # torch.export runs; staging() makes tensor predicates emit torch.cond/while_loop.
    step("rewrite + capture" if unroll is None else f"rewrite (decode loop unrolled, max_len={unroll.max_len}) + capture")
    with contextlib.ExitStack() as patched:
        rewrite_record = patched.enter_context(rewritten(model, method, unroll))
        t_rewrite = time.perf_counter()
        patched.enter_context(staging())
        cap = capture(model, args, method, dynamic_batch=dynamic_batch)
    t1 = time.perf_counter()
    step("lower")
    # int64 stays int32 unless some int64 value may leave int32; then the program is built and
    # run inside JAX's 64-bit scope (see lower/dtypes.py)
    ints = int64_verdict(cap.ep.graph_module, [e.tensor for e in cap.state])
    with int_scope(ints.wide):
        graph = LoweredGraph.build(cap.ep.graph_module, name=f"{type(model).__name__}.{method}")
        module, variables = build_module(cap.state)
        t2 = time.perf_counter()
        jm = JaxModel(module, variables, [e.path for e in cap.state], staged_fn(graph), CallSignature.of(cap),
                      "staged", x64=ints.wide, finish=finish if unroll is not None else None)
        step("check")
        # Trace once on the example's shapes (no compile, no compute): every lowering and every
        # branch-shape check runs now, so problems surface at conversion rather than first call.
        jax.eval_shape(jm._fn, jm._state_values(), jm.signature.bind(args))
    t3 = time.perf_counter()
    timings = {"rewrite_s": t_rewrite - t0, "export_s": cap.export_seconds, "decompose_s": cap.decompose_seconds,
               "capture_s": t1 - t_rewrite, "lower_s": t2 - t1, "check_s": t3 - t2}
    jm._report = build_report(type(model).__name__, method, jm.host, cap, graph, timings, rewrite_record)
    jm._report.integers = describe_ints(ints)
    return jm


def _dispatch(model: torch.nn.Module, args: tuple, method: str, step: Callable[[str], None],
              reason: str | None, staged_attempt_s: float) -> JaxModel:
    t0 = time.perf_counter()
    step("rewrite (dispatch)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the staged attempt (or its absence) already warned once
        plan = dispatch_plan(model, method)
    entries = [StateEntry(p, "param", t.detach()) for p, t in model.named_parameters()]
    entries += [StateEntry(p, "buffer", t) for p, t in model.named_buffers()]
    module, variables = build_module(entries)
    paths = [e.path for e in entries]
    leaves, spec = pytree.tree_flatten(args)
    index = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
    names = _leaf_names(model, method, args)
    # shapes may change from call to call: the host compiles each signature it meets
    inputs = [TensorSpec(names[i], (None,) * leaves[i].dim(), leaves[i].dtype) for i in index]
    signature = CallSignature(inputs, spec, leaves, index, pytree.tree_structure(0))
    dispatch = DispatchHost(model, method, plan, paths, leaves, spec, index)
    jm = JaxModel(module, variables, paths, dispatch, signature, "dispatch", jit=False, structured=True)
    t1 = time.perf_counter()
    step("compile the example's path")
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
