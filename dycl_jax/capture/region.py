"""Captures one dispatch region (a Python callable over a model's state) for one input signature."""
from __future__ import annotations

import contextlib
import time
import types
import warnings
from dataclasses import dataclass
from typing import Any, Callable, ContextManager

import jax
import numpy as np
import torch
from torch.export import ExportedProgram

from dycl_jax.capture import bounded_rows, host_clock, int_inputs
from dycl_jax.capture.ordered_dicts import keep_order
from dycl_jax.capture.export import StateEntry, _eval_mode, _quiet_torch_logs, _state_entries, _strip, to_core_aten
from dycl_jax.capture.train_mode import training
from dycl_jax.rewrite.raises import PathRaised
from dycl_jax.capture.view_layout import make as make_view, view_layouts
from dycl_jax.errors import CaptureError
from dycl_jax.rewrite.minmax import python_builtins
from dycl_jax.rewrite.modes import caller_tensors
from dycl_jax.rewrite.plan import Undefined

# Python values a captured region may return as constants of its input signature.
_CONSTANT_TYPES = (int, float, bool, complex, str, bytes, type(None), type(Ellipsis), range, slice, type,
                   torch.dtype, torch.device, torch.Size, np.generic, torch.nn.Module, types.FunctionType,
                   types.MethodType, types.BuiltinFunctionType, Undefined)


class HostValueError(CaptureError):
    """The region returns a value computed from tensor data (e.g. `.item()`) or an object that
    cannot be a constant of its input shapes: it runs on the host instead. `output`: which of
    the region's outputs holds it, where known (the host then splits at the statement writing
    that output rather than searching by halves, which leaves needless parts)."""

    def __init__(self, message: str, output: int | None = None) -> None:
        super().__init__(message)
        self.output = output


def _output_of(out: Any, k: int) -> int | None:
    """Position, in a region body's `(outputs, attributes)` result, of the output holding flat leaf k."""
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], tuple)):
        return None
    for j, o in enumerate(out[0]):
        n = len(jax.tree_util.tree_leaves(keep_order(o)))
        if k < n:
            return j
        k -= n
    return None  # a module attribute's value


@dataclass
class CapturedRegion:
    """A region's graph for one input signature, and how to rebuild its outputs."""

    ep: ExportedProgram
    state: list[StateEntry]
    out_tree: Any  # jax treedef of the region's outputs
    slots: list[int | None]  # per output leaf: index among the graph's outputs, None for a constant
    constants: list[Any]  # per output leaf: the constant (where slots[i] is None)
    seconds: float
    mutated: tuple[int, ...] = ()  # argument leaves the region updates in place
    passed: list[int | None] | None = None  # per output leaf: the argument leaf it returns unchanged
    inputs: tuple[int, ...] = ()  # argument leaf of each graph input: tensors and symbolic ints
    ints: int_inputs.SymbolicInts | None = None  # the Python ints exported as symbols, if any
    # train mode: the state paths of the buffers the region updates (the graph's first outputs)
    mutations: tuple[str, ...] = ()
    views: tuple[tuple[int, str, int], ...] = ()  # output leaves that are views (view_pairs)
    view_layouts: tuple = ()  # per view pair: its Layout in the other leaf (capture/view_layout.py) or None
    bounded_rows: tuple = ()  # Locations of the row selections taking their dense form (capture/bounded_rows.py)


class _CallWrapper(torch.nn.Module):
    """forward(*tensor leaves) = fn(*args) with the non-tensor leaves of args baked in."""

    def __init__(self, root: torch.nn.Module, fn: Callable, leaves: list[Any], tree: Any, sink: dict,
                 callers: frozenset = frozenset(), same: tuple = (), dynamic: frozenset = frozenset()):
        super().__init__()
        self.m = root  # the model's state is lifted under `m.`, i.e. under its torch paths
        self._fn, self._leaves, self._tree, self._sink = fn, leaves, tree, sink
        self._tensors = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]
        # graph inputs: the tensors and the Python ints exported as symbols, in leaf order
        self._index = sorted(set(self._tensors) | dynamic)
        self._callers = callers  # leaf indices holding the caller's own tensors
        # leaf -> an earlier leaf that is the same tensor for the user's code
        self._same = {p[0]: p[1] for p in same if len(p) == 2}
        # leaf -> (the leaf it views, its layout): made a view of that leaf's copy, so an update of
        # either reaches the other inside the program, as in torch (host/view_families.py)
        self._views = {p[0]: (p[1], p[2]) for p in same if len(p) == 3}
        self._checked = [i for i in self._tensors if i not in self._views]  # (a view shares its base's version)
        # a base's update reaches its views in the program (their outputs are made from it); a
        # base no name returns is dead with its views: the host's analysis passes every live
        # name that may hold it through the update (dispatch_split._kept_by_update)
        self._bases = {j for j, _ in self._views.values()}

    def forward(self, *inputs: Any) -> tuple[torch.Tensor, ...]:
        leaves = list(self._leaves)
        for i, t in zip(self._index, inputs):
            # in-place updates of an input stay inside the region; names of one tensor share its
            # copy (`a = v; v.add_(h)` changes `a` too), the other operand goes unread
            if not isinstance(t, torch.Tensor):
                leaves[i] = t
            elif i not in self._same:
                leaves[i] = t.clone()
        for i, (j, at) in self._views.items():
            leaves[i] = make_view(leaves[j], at)
        # after the views: a second name of a view (`t = a`, `a = v[:, :2]`) is that view, not a
        # copy of the input made before it became one
        for i, j in self._same.items():
            leaves[i] = leaves[j]
        versions = [leaves[i]._version for i in self._checked]
        # a staged branch must not update them; Python's max/min, not export's torch.maximum; clock reads counted
        with caller_tensors([leaves[i] for i in self._callers]), python_builtins(), host_clock.watched():
            out = self._fn(*jax.tree_util.tree_unflatten(self._tree, leaves))
        flat, tree = jax.tree_util.tree_flatten(keep_order(out))  # dicts come back in their own key order
        lost_update(self._leaves, [leaves[i] if i not in self._bases else None for i in self._checked], versions,
                    flat)
        mutated = tuple(i for i, v in zip(self._checked, versions) if leaves[i]._version != v)
        # an input returned as it came (`y = x`) stays the caller's array: identity is how the
        # host tells the caller's tensors apart, and it saves a copy
        kept = {id(leaves[i]): i for i in self._index if i not in mutated and i not in self._same
                and i not in self._views}
        symbols = {s: i for i in self._index if (s := int_inputs.symbol_of(leaves[i])) is not None}
        slots: list[int | None] = []
        constants: list[Any] = []
        passed: list[int | None] = []
        results: list[torch.Tensor] = []
        computed: list[int_inputs.IntResult] = []  # ints and bools the host computes from the call's ints
        unresolved: set = set()  # symbols behind an output the host cannot compute: they must be static
        made: dict[int, int] = {}  # id of an output tensor -> its slot: names of one tensor get one array
        for k, v in enumerate(flat):
            passed.append(kept.get(id(v)))
            if passed[-1] is not None:
                slots.append(None)
                constants.append(None)
            elif isinstance(v, torch.Tensor) and id(v) in made:
                slots.append(made[id(v)])
                constants.append(None)
            elif isinstance(v, torch.Tensor):
                made[id(v)] = len(results)
                slots.append(len(results))
                constants.append(None)
                results.append(v)
            elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) and symbols \
                    and v.node.expr.free_symbols <= set(symbols):  # from the Python ints the region got
                if isinstance(v, torch.SymFloat):
                    unresolved |= v.node.expr.free_symbols
                else:
                    computed.append(int_inputs.int_result(len(slots), v, symbols))
                slots.append(None)
                constants.append(None)
            elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                raise HostValueError(f"a Python value computed from tensor data ({type(v).__name__} {v})",
                                     _output_of(out, k))
            elif isinstance(v, _CONSTANT_TYPES):
                # a slice or size holding a symbolic int is no constant: those ints must be static
                unresolved |= {s for p in _parts(v) if isinstance(p, torch.SymInt) for s in p.node.expr.free_symbols}
                slots.append(None)
                constants.append(v)
            else:
                raise HostValueError(f"a {type(v).__name__} object, which is not a tensor or a Python constant",
                                     _output_of(out, k))
        views = view_pairs(leaves, flat)
        self._sink.update(tree=tree, slots=slots, constants=constants, mutated=mutated, passed=passed,
                          computed=computed, unresolved=unresolved, views=views,
                          view_layouts=view_layouts(leaves, flat, views))
        return tuple(results)


def view_pairs(inputs: list[Any], outputs: list[Any],
               root: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[tuple[int, str, int], ...]:
    """(k, "in" or "out", j): output leaf k shares memory with input leaf j or an earlier output
    leaf j without being that tensor (a view: slicing, `.view`, `.t()`, `.detach()`). Torch
    changes both where one is updated in place; the host holds them as separate arrays.
    `root`: the tensor a tensor views where its storage does not say (a host statement's JAX
    results are copies); memory is compared by storage, as `.detach()` has no `_base`."""
    root = root or (lambda t: t)
    # per memory, the tensor the others are named views of: a base (not itself a view) where
    # one is there, else the first met (inputs first)
    chosen: dict[Any, tuple[str, int, torch.Tensor]] = {}
    for kind, leaves in (("in", inputs), ("out", outputs)):
        for j, t in enumerate(leaves):
            if isinstance(t, torch.Tensor):
                memory = _memory(root(t))
                if memory not in chosen or (_is_base(t) and not _is_base(chosen[memory][2])):
                    chosen[memory] = (kind, j, t)
    pairs = []
    for k, t in enumerate(outputs):
        if isinstance(t, torch.Tensor):
            kind, j, other = chosen[_memory(root(t))]
            if other is not t:
                pairs.append((k, kind, j))
    return tuple(pairs)


def _memory(t: torch.Tensor) -> Any:
    """What identifies `t`'s memory: its storage (shared by every view, `.detach()` included;
    fake tensors have one too), else the tensor it is a view of."""
    try:
        return ("storage", t.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError):  # a tensor without storage (a subclass)
        return ("tensor", id(t._base if t._base is not None else t))


def _is_base(t: torch.Tensor) -> bool:
    return t._base is None and t.storage_offset() == 0


def _parts(v: Any) -> tuple:
    return (v.start, v.stop, v.step) if isinstance(v, slice) else tuple(v) if isinstance(v, torch.Size) else ()


def lost_update(names: Any, inputs: list[torch.Tensor | None], versions: list[int], outputs: list[Any]) -> None:
    """Raise if an input tensor was updated in place but is not among the outputs: the caller
    (the host, holding immutable arrays) would never see the update. (None: an input not checked.)"""
    returned = {id(v) for v in outputs if isinstance(v, torch.Tensor)}
    for t, v in zip(inputs, versions):
        if t is not None and t._version != v and id(t) not in returned:
            raise HostValueError("an in-place update of a tensor the statement reads but does not rebind "
                                 f"({type(t).__name__}{list(t.shape)}); it would be lost")


def capture_call(root: torch.nn.Module, fn: Callable, args: tuple, context: Callable[[], ContextManager],
                 callers: frozenset = frozenset(), same: tuple = (),
                 dynamic: frozenset = frozenset(), dims: list[list[int]] | None = None,
                 leaf_view: Callable[[Any], Any] | None = None, train: bool = False,
                 dense_budget: float | None = None) -> CapturedRegion:
    """Export `fn(*args)` (tensors in `args` are example inputs) and decompose it.

    `same`: pairs (leaf, earlier leaf) of `args` that the user's code holds as one tensor, and
    triples (leaf, leaf, Layout): the first a view of the second (capture/view_layout.py).
    `dims`: per tensor input, the dimensions exported as `Dim.AUTO` (static shapes if None);
    with symbolic ints too, the graph's guards must read only the ints (else `ints.static`).
    `leaf_view`: mapped over `args` before flattening, so that its leaves are the caller's
    (the dispatch host opens nested functions into their closure cells).
    `train`: capture in training mode (capture/train_mode.py): the buffers updated become the
    first graph outputs, named by `mutations`.
    `dense_budget`: the most contraction work a row selection's dense form (rewrite/rows.py) may
    take; over it, or not proved row-wise, the capture is refused (capture/bounded_rows.py).

    The int leaves in `dynamic` are exported as symbolic ints (see int_inputs.py); the result's
    `ints` says which of them must be static after all. `context` is entered around export
    (the host's rewrite patches and staging mode). Errors propagate as raised: the host decides
    which of them move the region to the host.
    """
    args = keep_order(args)  # the region's code sees dicts in the caller's key order
    leaves, tree = jax.tree_util.tree_flatten(keep_order(jax.tree_util.tree_map(leaf_view, args)) if leaf_view else args)
    sink: dict[str, Any] = {}
    wrapper = _CallWrapper(root, fn, leaves, tree, sink, callers, same, dynamic)
    inputs = tuple(leaves[i] for i in wrapper._index)
    start = time.perf_counter()
    with warnings.catch_warnings(), _quiet_torch_logs(), contextlib.ExitStack() as stack:
        warnings.simplefilter("ignore")
        stack.enter_context(context())
        # (warnings are off here: to_jax warned once already)
        stack.enter_context(training(root) if train else _eval_mode(root))
        if dims is not None:  # one entry, for the wrapper's `*inputs`: per tensor its dynamic dims
            per_tensor = iter(dims)  # (symbolic ints in between, in leaf order)
            shapes = (tuple(torch.export.Dim.AUTO if i in dynamic else {d: torch.export.Dim.AUTO
                                                                          for d in next(per_tensor)}
                            for i in wrapper._index),)
        else:
            shapes = int_inputs.export_spec(wrapper._index, dynamic) if dynamic else None
        if dynamic:
            stack.enter_context(int_inputs.symbolic_setitem())
        try:
            ep = torch.export.export(wrapper, inputs, dynamic_shapes=shapes)
        except PathRaised as raised:  # the user's `raise` inside a traced path (rewrite/raises.py)
            raise raised.refusal() from raised.exc
        ep = to_core_aten(ep)
        dense = bounded_rows.prove(ep.graph_module, dense_budget)
    ints = int_inputs.analyse(ep, wrapper._index, dynamic, sink["unresolved"], sink["computed"]) if dynamic else None
    mutations = tuple(_strip(s.target) for s in ep.graph_signature.output_specs
                      if s.kind == torch.export.graph_signature.OutputKind.BUFFER_MUTATION) if train else ()
    return CapturedRegion(ep, _state_entries(ep, train), sink["tree"], sink["slots"], sink["constants"],
                          time.perf_counter() - start, sink["mutated"], sink["passed"], tuple(wrapper._index), ints,
                          mutations, sink["views"], sink["view_layouts"], tuple(dense))

