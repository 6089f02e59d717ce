"""Captures one method of an nn.Module with torch.export, decomposed to core ATen."""
from __future__ import annotations

import contextlib
import functools
import inspect
import io
import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch.export import Dim, ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from dycl_jax.capture import bounded_rows, host_clock, host_rng
from dycl_jax.capture.checked_linalg import UNCHECKED
from dycl_jax.capture.composite_override import fast_override
from dycl_jax.capture.shims import capture_shims
from dycl_jax.capture.train_mode import training
from dycl_jax.errors import CaptureError, DyclError, InputMutationError, Location, limitation, raised_by_us
from dycl_jax.rewrite import attribute_watch
from dycl_jax.rewrite.minmax import python_builtins
from dycl_jax.rewrite.modes import caller_tensors
from dycl_jax.rewrite.raises import PathRaised

_PREFIX = "m."  # the user's module sits at `m` inside the wrapper below


@dataclass(frozen=True)
class TensorSpec:
    """One tensor input: its shape (None marks a dynamic dimension) and torch dtype."""

    name: str
    shape: tuple[int | None, ...]
    dtype: torch.dtype

    def describe(self) -> str:
        dims = ", ".join("B" if d is None else str(d) for d in self.shape)
        return f"{str(self.dtype).replace('torch.', '')}[{dims}]"


@dataclass
class StateEntry:
    """A parameter, buffer or constant the graph reads, under its torch state_dict path."""

    path: str
    kind: str  # "param" | "buffer" | "constant"
    tensor: torch.Tensor


@dataclass
class CapturedProgram:
    """The exported graph plus what is needed to call it like the original method."""

    ep: ExportedProgram
    state: list[StateEntry]
    inputs: list[TensorSpec]
    in_spec: pytree.TreeSpec  # structure of the method's positional args
    arg_leaves: list[Any]  # example leaves: tensors are placeholders, others are baked in
    tensor_leaf_index: list[int]  # which leaves are tensor inputs
    out_spec: pytree.TreeSpec
    out_is_python: list[bool] = field(default_factory=list)  # Python scalars returned as 0-d
    export_seconds: float = 0.0  # torch.export.export
    decompose_seconds: float = 0.0  # run_decompositions to core ATen
    export_cpu_seconds: float = 0.0  # the same two as CPU time of the process (all its threads)
    decompose_cpu_seconds: float = 0.0
    # train mode: the buffers the program updates, as the first graph outputs, in that order
    mutations: list[str] = field(default_factory=list)
    # bounded row selections proved row-wise, staged as masked dense computations
    bounded_rows: list[Location] = field(default_factory=list)


class _MethodWrapper(torch.nn.Module):
    """Exposes `model.<method>(*args)` as forward(*tensor_leaves), with non-tensors baked in."""

    def __init__(
        self, model: torch.nn.Module, method: str, leaves: list[Any], spec: pytree.TreeSpec, sink: Callable[..., None]
    ):
        super().__init__()
        self.m = model
        self._method = method
        self._leaves = leaves
        self._spec = spec
        self._tensor_index = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        # export may copy the module and restores its attributes, so the output structure
        # leaves through a function, which copying shares rather than duplicates
        self._sink = sink

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        leaves = list(self._leaves)
        for i, t in zip(self._tensor_index, tensors):
            leaves[i] = t
        with caller_tensors(tensors), python_builtins(), host_clock.watched():  # Python's max/min, not export's torch.maximum
            out = getattr(self.m, self._method)(*pytree.tree_unflatten(leaves, self._spec))
        flat, out_spec = pytree.tree_flatten(out)
        self._sink(out_spec=out_spec, out_is_python=[not isinstance(v, torch.Tensor) for v in flat])
        return tuple(_as_tensor(v) for v in flat)


def _as_tensor(v: Any) -> torch.Tensor:
    if isinstance(v, torch.Tensor):
        return v
    if isinstance(v, (bool, int, float)):
        return torch.tensor(v)
    raise DyclError(
        f"the method returns a {type(v).__name__}, which dycl_jax cannot return from JAX",
        fix="return tensors, Python numbers, or tuples/lists/dicts of them",
    )


def _dynamic_shapes(tensors: list[torch.Tensor], dynamic_batch: bool) -> tuple[Any, ...] | None:
    # Dim.AUTO lets export keep the batch dimension symbolic where the model allows it and
    # specialise it silently where it does not (e.g. a hard-coded `view(2, -1)`). Only tensors
    # whose first dim equals the first input's count as batched: a (3,) bias-like argument
    # must stay static. Batch sizes of 0 and 1 are specialised by torch, so none is marked.
    if not dynamic_batch or not tensors or tensors[0].dim() == 0 or tensors[0].shape[0] < 2:
        return None
    batch = tensors[0].shape[0]
    specs = tuple({0: Dim.AUTO} if t.dim() >= 1 and t.shape[0] == batch else None for t in tensors)
    # forward(*tensors) takes varargs, so the spec is one tuple inside the args tuple.
    return (specs,)


@functools.lru_cache(maxsize=1)
def _core_aten_table_for(operators: frozenset[str]) -> dict:
    # torch builds the default table lazily and materialises it on every run_decompositions
    # (~30 ms, every region capture): built once per set of registered operators, since the
    # table holds the decompositions of custom ops registered so far
    # `detach` must reach the lowering (lax.stop_gradient): the default table turns it into
    # `alias`, which would make a straight-through estimator's gradient zero under jax.grad
    table = torch.export.default_decompositions()
    table.pop(torch.ops.aten.detach.default, None)
    # torch's decomposition of an integer `linspace` steps from the unrounded float bounds, where
    # its kernel (which lower/ops/creation.py replays) truncates them first: 4.3..-3 starts 4, 4, 4
    # instead of 4, 3, 3
    table.pop(torch.ops.aten.linspace.default, None)
    table.update(UNCHECKED)  # no effect tokens for torch's linalg error checks (checked_linalg.py)
    return dict(table)


def _core_aten_table() -> dict:
    """The decomposition table of every capture: a copy, as run_decompositions may change it."""
    return dict(_core_aten_table_for(frozenset(torch._C._dispatch_get_all_op_names())))


@functools.lru_cache(maxsize=1)
def _core_aten_split_for(operators: frozenset[str]) -> tuple[dict, dict]:
    # run_decompositions splits its table into CompositeImplicitAutograd ops (overridden while
    # tracing) and python decompositions on every call, walking every registered operator
    # (~50 ms a capture); the split depends only on the table and the registered operators
    from torch.export.exported_program import _split_decomp_table_to_cia_and_python_decomp

    return _split_decomp_table_to_cia_and_python_decomp(dict(_core_aten_table_for(operators)))


def run_core_aten_decompositions(ep: ExportedProgram) -> ExportedProgram:
    """`ep.run_decompositions(_core_aten_table())` with the table's split computed once and
    torch's composite override installed faster (composite_override.py); the same graph."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.export.exported_program import _decompose_exported_program

    cia, python = _core_aten_split_for(frozenset(torch._C._dispatch_get_all_op_names()))
    with unset_fake_temporarily(), fast_override():  # as run_decompositions (_disable_prexisiting_fake_mode)
        return _decompose_exported_program(
            ep, cia_to_decomp=dict(cia), python_decomp_table=dict(python),
            joint_loss_index=None, decompose_custom_triton_ops=False,
        )


def _detach_no_grad_outputs(ep: ExportedProgram) -> None:
    """`with torch.no_grad():` arrives as a wrap_with_set_grad_enabled(False, ...) region, which
    decomposition inlines; detaching its outputs first keeps torch's gradients (none through it)."""
    hop = torch.ops.higher_order.wrap_with_set_grad_enabled
    for gm in ep.graph_module.modules():
        if not isinstance(gm, torch.fx.GraphModule):
            continue
        regions = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is hop and n.args[0] is False]
        for node in regions:
            for out in list(node.users):  # the region's outputs come out through getitem
                with gm.graph.inserting_after(out):
                    detached = gm.graph.call_function(torch.ops.aten.detach.default, (out,))
                detached.meta = dict(out.meta)
                out.replace_all_uses_with(detached, delete_user_cb=lambda n, d=detached: n is not d)
        if regions:
            gm.recompile()


def to_core_aten(ep: ExportedProgram) -> ExportedProgram:
    """Decompose an exported program to core ATen, keeping `detach` (see _core_aten_table) and
    the gradient cut of `no_grad` blocks."""
    _detach_no_grad_outputs(ep)
    tied = _untie_buffers(ep)
    out = run_core_aten_decompositions(ep)
    for program in (ep, out):  # the tie restored: one tensor under both names again
        for name, t in tied.items():
            if name in program.state_dict:
                program.state_dict[name] = t
    return out


def _untie_buffers(ep: ExportedProgram) -> dict[str, torch.Tensor]:
    """Give a buffer held under two names (a submodule registered twice) a distinct tensor per
    name, for the decomposition: functionalizing an update of it (train-mode BatchNorm) would
    otherwise need a runtime wrapper for the duplicated input, which export refuses ("expected
    compiled_fn to be GraphModule"). The graph reads the buffer through one name only, so the
    copies change nothing in it. Returns {second name: the shared tensor}."""
    seen: set[int] = set()
    tied: dict[str, torch.Tensor] = {}
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.BUFFER and spec.persistent:
            t = ep.state_dict[spec.target]
            if id(t) in seen:
                tied[spec.target] = t
                ep.state_dict[spec.target] = t.detach().clone()
            seen.add(id(t))
    return tied


def capture(
    model: torch.nn.Module,
    example_args: tuple[Any, ...],
    method: str = "forward",
    *,
    dynamic_batch: bool = True,
    decompose: Callable[[ExportedProgram], ExportedProgram] | None = None,
    train: bool = False,
) -> CapturedProgram:
    """Export `model.<method>(*example_args)` and decompose it to core ATen.

    train: capture in training mode (batch statistics, dropout on); buffer updates become
    graph outputs (`CapturedProgram.mutations`) instead of being refused."""
    if not callable(getattr(model, method, None)):
        raise DyclError(f"{type(model).__name__} has no method {method!r}", fix="pass method=<name of a method>")
    leaves, spec = pytree.tree_flatten(tuple(example_args))
    record: dict[str, Any] = {}
    wrapper = _MethodWrapper(model, method, leaves, spec, record.update)
    tensors = [leaves[i] for i in wrapper._tensor_index]
    start, cpu_start = time.perf_counter(), time.process_time()
    generators = host_rng.state()
    try:
        mode = training(model) if train else _eval_mode(model)
        with warnings.catch_warnings(), mode, _quiet_torch_logs():
            warnings.simplefilter("ignore")
            try:
                ep = torch.export.export(wrapper, tuple(tensors), dynamic_shapes=_dynamic_shapes(tensors, dynamic_batch))
            finally:  # a failed export may have drawn as well: the generators go back either way
                which = host_rng.restore(generators)
            if which is not None:
                raise host_rng.refusal(which, attribute_watch.user_functions([model]))
            exported, cpu_exported = time.perf_counter(), time.process_time()
            ep = decompose(ep) if decompose else to_core_aten(ep)
            # bounded row selections (staged host only): row-wise, else refused
            bounded = bounded_rows.prove(ep.graph_module)
    except PathRaised as raised:  # the user's `raise` inside a traced path (rewrite/raises.py)
        raise raised.refusal() from raised.exc
    except DyclError:
        raise
    except Exception as exc:
        if raised_by_us(exc):
            raise  # our bug: never a refusal (nor, under host="auto", a quiet move to dispatch)
        raise CaptureError(
            f"torch.export could not capture {type(model).__name__}.{method}: {_root_cause(exc)}",
            fix="see the chained exception for the line torch.export rejected",
        ) from exc
    done, cpu_done = time.perf_counter(), time.process_time()
    leaf_names = _leaf_names(model, method, example_args)
    return CapturedProgram(
        ep=ep,
        state=_state_entries(ep, train, _user_names(ep, leaf_names, wrapper._tensor_index)),
        inputs=_input_specs(ep, leaf_names, wrapper._tensor_index),
        in_spec=spec,
        arg_leaves=leaves,
        tensor_leaf_index=wrapper._tensor_index,
        out_spec=record["out_spec"],
        out_is_python=record["out_is_python"],
        export_seconds=exported - start,
        decompose_seconds=done - exported,
        export_cpu_seconds=cpu_exported - cpu_start,
        decompose_cpu_seconds=cpu_done - cpu_exported,
        mutations=[_strip(s.target) for s in ep.graph_signature.output_specs if s.kind == OutputKind.BUFFER_MUTATION],
        bounded_rows=bounded,
    )


def _root_cause(exc: BaseException, limit: int = 600) -> str:
    # torch wraps the informative error (e.g. a fake-tensor RuntimeError) in generic ones
    while exc.__cause__ is not None:
        exc = exc.__cause__
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


@contextlib.contextmanager
def _quiet_torch_logs():
    # a failed export logs whole graphs at ERROR level; our CaptureError carries the cause
    loggers = [logging.getLogger(n) for n in ("torch.fx.experimental.symbolic_shapes", "torch.export", "torch._export")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        # ... and prints the partial graph of a failed export to stderr
        with contextlib.redirect_stderr(io.StringIO()), capture_shims():
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module):
    # dycl_jax converts for inference: BatchNorm uses running statistics, dropout is off.
    was_training = model.training
    if was_training:
        warnings.warn(f"{type(model).__name__} is in training mode; converting it in eval mode", stacklevel=4)
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _strip(path: str) -> str:
    return path[len(_PREFIX):] if path.startswith(_PREFIX) else path


def _user_names(ep: ExportedProgram, leaf_names: list[str], tensor_index: list[int]) -> dict[str, str]:
    """The user's name of each tensor input (its parameter and path) by the exported placeholder's name."""
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    return {name: leaf_names[leaf] for name, leaf in zip(user, tensor_index)}


def _state_entries(ep: ExportedProgram, train: bool = False, names: dict[str, str] | None = None) -> list[StateEntry]:
    entries = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            continue
        target = spec.target
        if spec.kind == InputKind.PARAMETER:
            entries.append(StateEntry(_strip(target), "param", ep.state_dict[target]))
        elif spec.kind == InputKind.BUFFER:
            t = ep.state_dict[target] if spec.persistent else ep.constants[target]
            entries.append(StateEntry(_strip(target), "buffer", t))
        elif spec.kind in (InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
            entries.append(StateEntry(_strip(target), "constant", ep.constants[target]))
        else:
            raise CaptureError(f"unsupported exported input kind {spec.kind} for {target}")
    for spec in ep.graph_signature.output_specs:
        if spec.kind == OutputKind.USER_INPUT_MUTATION:
            # the caller's tensor would change in torch; no converted model (staged or dispatch) can do that
            arg = (names or {}).get(spec.target, spec.target)
            raise InputMutationError(
                f"the method updates its input `{arg}` in place; converted models are pure functions "
                "and cannot change the caller's tensors",
                fix=limitation(f"the converted model would have to change the caller's `{arg}` as torch "
                               "does; no converted model returns or writes back an updated input yet",
                               "dycl_jax/capture/export.py, USER_INPUT_MUTATION"),
            )
        if train and spec.kind == OutputKind.BUFFER_MUTATION:
            continue  # train mode: BatchNorm statistics, returned as a state update
        if spec.kind != OutputKind.USER_OUTPUT:
            raise CaptureError(
                f"the method mutates {spec.target} ({spec.kind.name}); converted models are pure",
                fix="convert the model in eval mode and avoid in-place updates of buffers in forward()",
            )
    return entries


def _leaf_names(model: torch.nn.Module, method: str, example_args: tuple[Any, ...]) -> list[str]:
    """A readable name per argument leaf: the parameter name, then the path inside it."""
    try:
        params = list(inspect.signature(getattr(model, method)).parameters)
    except (TypeError, ValueError):
        params = []
    names = []
    for path, _ in pytree.tree_flatten_with_path(tuple(example_args))[0]:
        pos = path[0].idx  # type: ignore[attr-defined]
        head = params[pos] if pos < len(params) else f"arg{pos}"
        names.append(head + pytree.keystr(path[1:]))
    return names


def _input_specs(ep: ExportedProgram, leaf_names: list[str], tensor_index: list[int]) -> list[TensorSpec]:
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    specs = []
    for name, leaf in zip(user, tensor_index):
        val = nodes[name].meta["val"]
        shape = tuple(d if isinstance(d, int) else None for d in val.shape)
        specs.append(TensorSpec(leaf_names[leaf], shape, val.dtype))
    return specs
