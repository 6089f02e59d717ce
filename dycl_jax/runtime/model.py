"""JaxModel: the converted model users call, differentiate, export and inspect."""
from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Callable

import jax
from flax import nnx

from dycl_jax.errors import DyclError
from dycl_jax.lower.int_ranges import int_scope
from dycl_jax.lower.ops.control_flow import differentiable, recording
from dycl_jax.rewrite.decisions import Decision
from dycl_jax.rewrite.regions import recording_decisions
from dycl_jax.runtime.signature import CallSignature
from dycl_jax.runtime.state import flat_values, path_values

if TYPE_CHECKING:  # the report stage comes after runtime; only its type is named here
    from dycl_jax.emit.writer import EmitInput
    from dycl_jax.report.record import ConversionReport

FlatFn = Callable[[list[Any], list[Any]], tuple[Any, ...]]
_RAW_VALUE = nnx.Variable.get_raw_value
# the slot get_raw_value returns, read in C (a Python method call per weight costs about 0.1 µs,
# a model reads tens of them per call); used only where the variable's class keeps that method
# and a probe shows the slot holds what it returns
_RAW_SLOT = operator.attrgetter("_raw_value")


def _raw_reader(variables: list[nnx.Variable]) -> Callable[[nnx.Variable], Any]:
    probe = nnx.Param(0)
    try:
        plain = _RAW_SLOT(probe) is probe.get_raw_value()
    except AttributeError:
        plain = False
    return _RAW_SLOT if plain and all(type(v).get_raw_value is _RAW_VALUE for v in variables) else _RAW_VALUE


class JaxModel:
    """A converted torch method: `jm(*args)`, pure `jm.apply(state, *args)`, `jm.module` state."""

    def __init__(
        self,
        module: nnx.Module,
        variables: list[nnx.Variable],
        paths: list[str],
        fn: FlatFn,
        signature: CallSignature,
        host: str,
        jit: bool = True,
        structured: bool = False,
        x64: bool = False,
        finish: Callable[[Any], Any] | None = None,
        value_paths: list[str] | None = None,
    ):
        self.module = module
        # torch paths of `variables`, where a rerolled run's stacked variable stands for several
        # (runtime/state.path_values); None: the torch paths are those of the emitted state
        self._value_paths = value_paths
        # a program that may hold int64 values outside int32 runs in JAX's 64-bit scope, entered
        # around each call (binding inputs, tracing and running); the process-wide setting is untouched
        self.x64 = x64
        self.host = host
        # how a padded program's method was rewritten (rewrite/api.UnrollOption), None if not one:
        # run_torch_trace(..., unroll=jm.unroll) gives its decisions in torch
        self.unroll: Any = None
        self.signature = signature
        self._variables = variables
        self._read = _raw_reader(variables)
        self._paths = paths
        self._fn = fn  # pure: (state values in graph order, tensor inputs) -> flat outputs
        # State is an argument of the jitted function, never a closed-over constant: calls
        # reuse the device arrays held by `module` (no copy) and see updates made to it.
        self._call = jax.jit(fn) if jit else fn
        self._report: ConversionReport | None = None
        self._report_builder: Callable[[], ConversionReport] | None = None  # a live report (dispatch host)
        # the converted model's class and file (the artifact's manifest); the dispatch host's reason's location
        self.source: dict[str, Any] = {}
        self.dispatch_location: Any = None
        # the dispatch host returns the method's own output structure; the staged one flat outputs
        self._unflatten = (lambda outs: outs) if structured else signature.unflatten
        # an unrolled decode loop returns padded outputs (runtime/decoded.py): calls trim them
        self._finish = finish or (lambda out: out)
        # Decision tracing compiles a second program whose lax ops report to this log; the
        # callback is bound when JAX traces, so it must stay the same object across calls.
        self._trace_log: list[Decision] = []
        # (a distinct function object, so JAX's trace cache never hands back the plain program)
        traced = lambda state, tensors, *extra: fn(state, tensors, *extra)  # noqa: E731
        self._trace_call = jax.jit(traced) if jit else traced
        self._batch_tracers: dict[tuple[int, int], Any] = {}  # trace_batch's programs, by (arguments, capacity)

    def __call__(self, *args: Any) -> Any:
        if self.x64:
            with int_scope(True):
                return self._finish(self._unflatten(self._call(self._state_values(), self.signature.bind(args))))
        # the hot path: the checks in bind() are remembered per input shape (signature.py)
        return self._finish(self._unflatten(self._call(self._state_values(), self.signature.bind(args))))

    def padded(self, *args: Any) -> Any:
        """The jitted call without trimming: for a model converted with `max_len`, a `Decoded`
        (`.value` with `Padded(value, lengths)` leaves where shapes vary, `.exceeded`)."""
        with int_scope(self.x64):
            return self._unflatten(self._call(self._state_values(), self.signature.bind(args)))

    def _state_values(self) -> list[Any]:
        # get_raw_value: the stored array itself; `.value`/get_value copy and warn (~10 µs each)
        return list(map(self._read, self._variables))

    def apply(self, state: nnx.State, *args: Any) -> Any:
        """Pure and jittable: the method's result given `state` (as from `nnx.state(jm.module)`).

        Differentiable with `jax.grad`: while loops with a static trip-count bound run as
        fori_loop here (same results as `jm(...)`, which exits loops early with while_loop).
        With an unrolled decode loop (`max_len`) the result is the padded form, as `padded`.
        """
        with int_scope(self.x64):
            tensors = self.signature.bind(args)
            with differentiable():
                return self._unflatten(self._fn(flat_values(state, self._paths), tensors))

    def trace(self, *args: Any) -> tuple[Any, list[Decision]]:
        """Run and return (outputs, decisions): each branch taken and each loop test, in order.

        Decisions are (site, value) pairs, e.g. ("if@model.py:42", True); the same list the
        rewritten torch program yields (see `dycl_jax.rewrite.api.run_torch_trace`). Each is a
        `Decision`, a pair that also has `.margin`: how far the predicate was from flipping
        (|lhs - rhs| of its comparisons; nan where unknown; see `dycl_jax.rewrite.decisions`).
        """
        with int_scope(self.x64):
            return self._traced(args)

    def _traced(self, args: tuple, *extra: Any) -> tuple[Any, list[Decision]]:
        tensors = self.signature.bind(args)
        if self.host == "dispatch":  # decisions are made in Python: the host records them as it goes
            with recording_decisions() as decisions:
                outs = self._call(self._state_values(), tensors)
            return outs, list(decisions)
        self._trace_log.clear()
        with recording(lambda site, value, margin: self._trace_log.append(Decision(site, value, margin))):
            outs = self._trace_call(self._state_values(), tensors, *extra)
        jax.block_until_ready(outs)
        jax.effects_barrier()  # callbacks may still be in flight after the result is ready
        decisions = list(self._trace_log)
        self._trace_log.clear()
        return self._traced_outputs(outs), decisions

    def trace_batch(self, *args: Any, capacity: int = 1024) -> tuple[Any, list[list[Decision]]]:
        """`jax.vmap(apply, in_axes=(None, 0))` over a batch of samples (axis 0 of every argument,
        each sample as the model takes it), with each sample's decisions: (outputs, one decision
        list per sample). The program is the vmapped `apply` with the decisions logged in it,
        compiled once per `capacity` and argument shapes; a sample making more than `capacity`
        decisions is an error that names the fix."""
        if self.host != "staged":
            raise DyclError(f"trace_batch vmaps the staged program; this model runs on the {self.host} host",
                            fix="call jm.trace on each sample")
        from dycl_jax.runtime.batch_trace import batch_tracer, read_logs

        key = (len(args), capacity)
        if key not in self._batch_tracers:
            self._batch_tracers[key] = batch_tracer(self, *key)
        fn, log = self._batch_tracers[key]
        outs, logged = fn(nnx.state(self.module), *args)
        return outs, read_logs(log, logged)

    def _traced_outputs(self, outs: tuple[Any, ...]) -> Any:
        return self._finish(self.signature.unflatten(outs))

    def export(self, path: str, *, trace_capacity: int = 4096, strict: bool = False) -> dict:
        """Write a deployable directory: StableHLO programs (plain and decision-traced), the state
        in safetensors and a JSON manifest; `dycl_jax.load(path)` runs it without torch.
        `trace_capacity` bounds the decisions one traced call can report. A dispatch-host model
        exports the region signatures it ran; what the artifact cannot serve for other inputs is
        an ExportCoverageWarning, or with `strict=True` a DyclError. Returns the manifest."""
        from dycl_jax.runtime.artifact import write_artifact  # the writer needs torch; loading does not
        return write_artifact(self, path, trace_capacity, strict)

    def to_source(self) -> str:
        """The program as a readable Flax NNX module (the text `emit` writes as model.py)."""
        from dycl_jax.emit.writer import emit_source  # torch is needed to emit, not to call

        return self._hosted_source()[0] if self.host == "dispatch" else emit_source(self._emitted())[0]

    def emit(self, out_dir: str) -> str:
        """Write `out_dir/model.py` (Flax NNX source, no torch or dycl_jax needed) and its weights
        beside it; `import model; m = model.load()` gives an nnx.Module called like this one."""
        from dycl_jax.emit.writer import write

        return write(self._hosted_source() if self.host == "dispatch" else self._emitted(), out_dir)

    def _hosted_source(self) -> tuple[str, dict]:
        """A dispatch-host model's emitted text and weights, from the region signatures its host has run."""
        from dycl_jax.emit.hosted import emit_hosted
        from dycl_jax.rewrite.modes import exclusive

        import numpy as np

        host = self._host_object()
        text, weights = exclusive(emit_hosted)(host, type(host.root).__name__)
        # the weights as this model holds them now (a train=True call's statistics, training in
        # JAX), not the torch model's: the regions were captured from torch's tensors
        for path, w in weights.items():
            i = host.path_index.get(path)
            if i is not None:
                weights[path] = np.asarray(self._variables[i].get_raw_value()).astype(w.dtype)
        return text, weights

    def _host_object(self) -> Any:
        """The dispatch host this model calls."""
        return self._fn

    def _emitted(self) -> "EmitInput":
        inp = getattr(self, "_emit_input", None)
        if inp is None:
            raise DyclError(
                f"emitted source is built for the staged host only; this model runs on the {self.host} host",
                fix="convert with host=\"staged\" (a decode loop may stage with max_len=N), or use jm.export")
        import dataclasses

        import numpy as np
        import torch

        # the weights as this model holds them now (after any training), in the torch dtypes
        # a rerolled run's stacked variables give each block's path its row (runtime/state.py)
        values = path_values(self._variables, self._value_paths or list(inp.state))
        state = {path: torch.from_numpy(np.array(values[path], dtype=np.float32 if meta.dtype == torch.bfloat16
                                                  else None)).to(meta.dtype) for path, meta in inp.state.items()}
        # parameters stay parameters (nnx.Param in the emitted module, what an optimizer trains)
        state = {p: torch.nn.Parameter(t, requires_grad=False) if p in inp.params else t for p, t in state.items()}
        return dataclasses.replace(inp, state=state)

    @property
    def state_paths(self) -> list[str]:
        """Paths in `nnx.state(jm.module)` of the state the program reads, in its input order: torch
        state_dict paths, except that a run of identical gated blocks rerolled into a scan holds
        each role once, stacked over its blocks (`rnet.blocks.0.1-17.conv1.weight`; its variable's
        `stacked_paths` names the blocks' torch paths, and `to_state_dict` gives them back)."""
        return list(self._paths)

    def report(self) -> "ConversionReport":
        """The conversion record (sub-networks, host, ops, timings); render it with dycl_jax.report."""
        if self._report_builder is not None:
            return self._report_builder()
        if self._report is None:
            raise RuntimeError("this JaxModel was built without a report")
        return self._report

    def __repr__(self) -> str:
        return f"JaxModel(host={self.host!r}, inputs={self.signature.describe()}, state={len(self._paths)} arrays)"
