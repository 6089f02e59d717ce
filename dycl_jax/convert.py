"""`to_jax`: runs the pipeline stages in order on one model method."""
from __future__ import annotations

import time
from typing import Any, Callable

import jax
import torch

import dycl_jax.lower.ops  # noqa: F401  (registers every lowering)
from dycl_jax.capture.export import capture
from dycl_jax.errors import DyclError
from dycl_jax.host.staged import staged_fn
from dycl_jax.lower.interpreter import LoweredGraph
from dycl_jax.report.build import build_report
from dycl_jax.rewrite.api import rewritten, staging
from dycl_jax.runtime.model import JaxModel
from dycl_jax.runtime.signature import CallSignature
from dycl_jax.runtime.state import build_module

HOSTS = ("auto", "staged")


def to_jax(
    model: torch.nn.Module,
    example_args: Any,
    *,
    method: str = "forward",
    host: str = "auto",
    dynamic_batch: bool = True,
    progress: Callable[[str], None] | None = None,
) -> JaxModel:
    """Convert `model.<method>` to JAX. Non-tensor leaves of `example_args` are baked in.

    `progress`, if given, is called with the name of each stage as it starts.
    """
    step = progress or (lambda stage: None)
    if not isinstance(model, torch.nn.Module):
        raise DyclError(f"to_jax expects a torch.nn.Module, got {type(model).__name__}")
    if host not in HOSTS:
        raise DyclError(f"unknown host {host!r}", fix=f"use one of {', '.join(HOSTS)}")
    args = example_args if isinstance(example_args, tuple) else (example_args,)
    t0 = time.perf_counter()
    # The rewritten method (and every user method it reaches) is patched in only while
    # torch.export runs; staging() makes tensor predicates emit torch.cond/while_loop.
    step("rewrite + capture")
    with rewritten(model, method) as rewrite_record, staging():
        cap = capture(model, args, method, dynamic_batch=dynamic_batch)
    t1 = time.perf_counter()
    step("lower")
    graph = LoweredGraph.build(cap.ep.graph_module, name=f"{type(model).__name__}.{method}")
    module, variables = build_module(cap.state)
    t2 = time.perf_counter()
    jm = JaxModel(module, variables, [e.path for e in cap.state], staged_fn(graph), CallSignature.of(cap), "staged")
    step("check")
    # Trace once on the example's shapes (no compile, no compute): every lowering and every
    # branch-shape check runs now, so problems surface at conversion rather than first call.
    jax.eval_shape(jm._fn, jm._state_values(), jm.signature.bind(args))
    t3 = time.perf_counter()
    timings = {"capture_s": t1 - t0, "lower_s": t2 - t1, "check_s": t3 - t2}
    jm._report = build_report(type(model).__name__, method, jm.host, cap, graph, timings, rewrite_record)
    return jm
