"""Dispatch host: the rewritten program's control flow runs in Python; every region (a run of
simple statements) runs as a jitted JAX program compiled per input signature, or on the host.

A region is first captured whole. If torch.export or the lowering refuses it (a data-dependent
shape, a value read with `.item()`, a branch-shape mismatch), it is split where it failed and
the parts are tried again; a single statement that still fails runs on the host (by JAX ops on
concrete arrays where it can, see jax_ops.py, else in torch), with its tensors converted at the
boundary. Every split is an equivalent program (the user's own statements, in order), so
falling back never changes a result, only where it is computed.
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import operator
import os
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.utils._pytree as pytree

from dycl_jax.capture import host_rng, int_inputs
from dycl_jax.capture.ordered_dicts import leaves_in_order
from dycl_jax.capture.bounded_rows import OverBudget
from dycl_jax.capture.region import HostValueError, capture_call, lost_update, view_pairs
from dycl_jax.errors import (AliasedUpdateError, CallError, DyclError, InputMutationError, Location,
                             StagedAliasError, limitation, raised_by_us)
from dycl_jax.host import chunks, jax_ops, reads, specialised, training, values, whole
from dycl_jax.host.carried import StandUsed, carry, only_moves
from dycl_jax.host.attributes import DynamicAttributes
from dycl_jax.host.module_state import ModuleState
from dycl_jax.host.view_families import Families
from dycl_jax.host.views import check_views_kept, user_locals
from dycl_jax.capture.fingerprint import graph_fingerprint
from dycl_jax.lower.int_ranges import int64_verdict, int_scope
from dycl_jax.lower.interpreter import LoweredGraph
from dycl_jax.rewrite import attribute_watch, lifting, rows
from dycl_jax.rewrite.api import DispatchPlan, patched
from dycl_jax.rewrite.appends import (appended_lists, appending, emptied, extended, kept_identity, kept_in_place,
                                      rejoined, shared_containers)
from dycl_jax.rewrite.modes import exclusive, staging
from dycl_jax.lower.ops.control_flow import recording
from dycl_jax.rewrite.regions import (EXECUTOR, NOT_STAGED, AliasChoice, RegionSpec, aliased_at_call, defined, executing,
                                      identities, island, note_margin, record_compiled, recording_margins, region, run_statements)

# True while a host statement runs in torch: a dispatch-rewritten method called from there
# converts its tensor arguments to JAX and its results back.
_IN_TORCH: contextvars.ContextVar[bool] = contextvars.ContextVar("dycl_in_torch", default=False)


class _land:
    """Sets `_IN_TORCH` for the duration (a class: entered around every host statement)."""

    __slots__ = ("in_torch", "token")

    def __init__(self, in_torch: bool) -> None:
        self.in_torch = in_torch

    def __enter__(self) -> None:
        self.token = _IN_TORCH.set(self.in_torch)

    def __exit__(self, *exc: object) -> None:
        _IN_TORCH.reset(self.token)


class _Calling:
    """What a host call sets for its duration, in one context entered on every call (four
    context managers cost microseconds per call): the host as the regions' executor, torch
    code off (`_IN_TORCH`), the dispatch rewrite patched in, grad mode on and inference mode
    off (each only where it is not already; `torch.inference_mode(False)` costs about 10 µs,
    the guard under it a fifth of that)."""

    __slots__ = ("host", "executor", "in_torch", "patch", "inference", "grad")

    def __init__(self, host: "DispatchHost") -> None:
        self.host = host

    def __enter__(self) -> None:
        self.executor = EXECUTOR.set(self.host)
        self.in_torch = _IN_TORCH.set(False)
        self.patch = patched(self.host.bindings)
        self.inference = self.grad = None
        try:
            self.patch.__enter__()
            if torch.is_inference_mode_enabled():
                self.inference = torch._C._InferenceMode(False)
                self.inference.__enter__()
            self.grad = torch.is_grad_enabled()
            if not self.grad:
                torch._C._set_grad_enabled(True)
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        if self.grad is False:
            torch._C._set_grad_enabled(False)
        if self.inference is not None:
            self.inference.__exit__(None, None, None)
        self.patch.__exit__()
        _IN_TORCH.reset(self.in_torch)
        EXECUTOR.reset(self.executor)


def _passthrough(placeholders: list, used: list[int], n_state: int, gm: Any) -> Callable:
    """A region whose graph only forwards inputs (`y = x`, Python-only outputs): run in Python."""
    position = {p: i for i, p in enumerate(placeholders)}
    state_slot = {i: k for k, i in enumerate(used)}
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    picks = [(position[o] < n_state, state_slot.get(position[o], position[o] - n_state)) for o in out]

    def run(state: list, tensors: list) -> tuple:
        return tuple(state[i] if is_state else tensors[i] for is_state, i in picks)
    return run


# A row selection inside an island (`out[sel] = expert(x[sel])` over the `nonzero` of a mask) may
# take the staged host's dense form (rewrite/rows.py): its rows' computation runs on every row, in
# the island's one program, instead of a program and a size read per selection. Past this much
# contraction work the exact row count is cheaper. On one CPU core, measured on the MoE example at
# batch 1 (scripts/bench_widths.py): 24 MFLOP dense ran 3.7x faster than exact routing, 94 MFLOP
# 1.1x faster, 377 MFLOP 1.2x slower. An accelerator's throughput is some hundred times a core's
# while a program call and a size read cost about the same, so its budget is scaled by that (not
# measured here).
DENSE_ROWS_FLOPS_CPU = 2e8
DENSE_ROWS_FLOPS_ACCELERATOR = 1e10


def dense_rows_budget() -> float:
    """The contraction work (FLOPs) a row selection's dense form may take in a dispatch island."""
    return DENSE_ROWS_FLOPS_CPU if jax.default_backend() == "cpu" else DENSE_ROWS_FLOPS_ACCELERATOR


class _IslandFailed(Exception):
    """An island did not stage: its host version runs from now on."""


class _NewAttributes(Exception):
    """A capture found module attributes the program writes: retry with them as state."""


def _leaf_names(ins: tuple[str, ...], tree: Any, wanted: list[int]) -> list[str]:
    """The user's name of each wanted leaf of `((values of ins), attrs)`: `x`, `xs[1]`, ..."""
    vals, _ = jax.tree_util.tree_unflatten(tree, list(range(tree.num_leaves)))
    names: dict[int, str] = {}
    for name, v in zip(ins, vals):
        idx = leaves_in_order(v)
        for k, i in enumerate(idx):
            names[i] = name if len(idx) == 1 else f"{name}[{k}]"
    return [names.get(i, "(module attribute)") for i in wanted]


@dataclass
class Compiled:
    """One captured signature of a part: a shared jitted program plus how to feed and unpack it."""

    fn: Callable  # shared between parts whose graphs have the same fingerprint
    sources: list[tuple[bool, Any]]  # per state input: (True, index into host state) or (False, constant array)
    tensor_leaves: list[int]  # which input leaves are the graph's tensor inputs
    out_tree: Any
    slots: list[int | None]
    constants: list[Any]
    mutated: tuple[int, ...] = ()  # input leaves the graph updates in place (checked against the caller's)
    passed: list[int | None] | None = None  # per output leaf: the input leaf it returns unchanged
    no_grad: bool = False  # captured inside the user's `with torch.no_grad():`
    x64: bool = False  # runs in JAX's 64-bit scope (int64 values that may leave int32)
    margins: Callable | None = None  # fn also returning each predicate output's margin (jm.trace)
    guard: Callable[[Sequence[Any]], bool] | None = None  # with symbolic int inputs: whether it holds for leaves
    computed: list[int_inputs.IntResult] = field(default_factory=list)  # ints the host computes from the call's
    symbolic: tuple[int, ...] = ()  # int leaves the program takes as (weakly typed) scalar inputs
    # the eval-mode capture at this signature with static shapes and ints, kept so that emit/hosted.py
    # writes its source without capturing again (one fx graph per signature; the lowered program holds
    # the first of each fingerprint anyway); None for symbolic ints and train mode
    captured: Any = field(default=None, compare=False, repr=False)
    views: tuple[tuple[int, str, int], ...] = ()  # output leaves that are views of others (checked once)
    view_layouts: tuple = ()  # per view pair: the view's Layout in the other, or None (capture/view_layout.py)
    tracked: tuple = ()  # the pairs the host registers per call (host/views.check_views_kept)
    conditional: tuple = ()  # (input leaf, pair | None): registered (or refused) where that input is of a family

    def __post_init__(self) -> None:
        # the per-call gathers run in C (itemgetter): islands take every parameter they read
        state_only = all(is_state for is_state, _ in self.sources)
        self._state_inputs = _getter([v for _, v in self.sources]) if state_only else None
        self._tensors = _getter(self.tensor_leaves)
        self._all_outputs = self.slots == list(range(len(self.slots)))
        # nothing to do around the program's call but gathering and unpacking: `run`'s short way
        self._plain = self._state_inputs is not None and self._all_outputs and self.passed is None \
            and not (self.computed or self.x64 or self.no_grad)

    def run(self, state: Sequence[Any], leaves: list[Any]) -> Any:
        if self._plain and not recording_margins():
            return jax.tree_util.tree_unflatten(self.out_tree, list(self.fn(self._state_inputs(state),
                                                                             self._tensors(leaves))))
        if self._state_inputs is not None:
            inputs = self._state_inputs(state)
        else:
            inputs = [state[v] if is_state else v for is_state, v in self.sources]
        if self.margins is not None and recording_margins():
            with int_scope(self.x64):
                # traced on first use here, with its conds and loops reporting to the trace
                with recording(record_compiled):
                    outs, margins = self.margins(inputs, self._tensors(leaves))
                jax.effects_barrier()  # its decisions are in the list before the host's next one
            for o, m in zip(outs, margins):
                if m is not None:
                    note_margin(o, float(m))
        elif self.x64:
            with int_scope(True):
                outs = self.fn(inputs, self._tensors(leaves))
        else:
            outs = self.fn(inputs, self._tensors(leaves))
        if self.no_grad:  # as in torch, no gradient flows out of a no_grad block
            outs = [jax.lax.stop_gradient(o) for o in outs]
        if self._all_outputs:
            flat = list(outs)
        else:
            flat = [outs[s] if s is not None else c for s, c in zip(self.slots, self.constants)]
        if self.passed is not None:
            flat = [leaves[p] if p is not None else v for p, v in zip(self.passed, flat)]
        for r in self.computed:  # `t + 1`, `t >= n` of Python ints the graph took as symbols
            flat[r.position] = r.kind(r.fn(*[leaves[i] for i in r.leaves]))
        return jax.tree_util.tree_unflatten(self.out_tree, flat)


def _check_aliases_kept(spec: RegionSpec, part: "Part", vals: tuple, leaves: list, mutated: tuple[int, ...],
                        env: Mapping) -> None:
    """Refuse a region that updates an array in place which another of the user's names also
    holds: torch changes both; the region gives a new value only to the names it outputs.
    (Checked when the region is captured, from the frame of the user's function and the names
    of a split region computed so far.)"""
    local = user_locals(env, (region,))
    owner = [n for n, v in zip(part.ins, vals) for _ in leaves_in_order(v)]  # leaf -> its name
    # a name no later statement reads may keep the old tensor
    later = None if spec.live_after is None else spec.live_after.union(*(st.ins for st in spec.statements[part.stop:]))
    for i in mutated:
        for m, value in local.items():
            if value is leaves[i] and (i >= len(owner) or m != owner[i]) and m not in part.outs \
                    and not m.startswith("_dycl_") and (later is None or m in later):
                st = spec.statements[part.first]
                raise AliasedUpdateError(
                    f"a statement in this region updates a tensor in place that `{m}` also holds; torch changes "
                    f"`{m}` too, a converted region returns a new value only to the names it assigns",
                    location=Location(spec.file, st.line, st.code),
                    fix=limitation(f"the converter did not see that `{m}` holds this tensor: it came from a call whose "
                                   "effects it cannot read, such as a lambda or a function without source",
                                   "dycl_jax/host/dispatch.py, _check_aliases_kept",
                                   'host="staged" keeps the update where the whole method stages'))


def _getter(indices: list[int]) -> Callable[[Sequence[Any]], list]:
    """seq -> [seq[i] for i in indices], as a list (the jitted programs take lists)."""
    if not indices:
        return lambda seq: []
    if len(indices) == 1:
        i = indices[0]
        return lambda seq: [seq[i]]
    pick = operator.itemgetter(*indices)
    return lambda seq: list(pick(seq))


_MISSED = object()  # no compiled program for this call (DispatchHost._compiled_call)
# signatures a plain-Python part caches beyond its first (each a short way for values met again);
# past them a new value runs checked as Python (`_direct_at_new_values`) with no entry
DIRECT_ENTRIES = 64
_IMMUTABLE = frozenset((int, float, bool, str, type(None), *values.DATES))  # values a Python statement cannot change in place


def _first_line(spec: RegionSpec, part: "Part") -> Location:
    """The user's line of a part's first statement (its refusals' location)."""
    st = spec.statements[part.first]
    return Location(spec.file, st.line, st.code)


def _immutable(vals: tuple, arrays: bool = False) -> bool:
    """Inputs a Python statement cannot change in place (a module's attributes are watched apart),
    with `arrays`, JAX arrays too."""
    return all(type(v) in _IMMUTABLE or isinstance(v, torch.nn.Module) or arrays and isinstance(v, values.ARRAYS)
               for v in vals)

DIRECT = "python"  # a signature with no tensors in or out: the statements run as plain Python
EAGER = "host"  # the part runs on the host (JAX ops on concrete arrays, or torch)
CARRIED = "carried"  # its statements only move their arrays: they run as Python (host/carried.py)
# an island at a signature whose row selection's dense form is over the budget (dense_rows_budget):
# its host version runs there, while its programs serve the signatures within the budget
OVER_BUDGET = "over budget"
READ = "read"  # `n = t.tolist()`, `t.nonzero()`, `t[mask]`... of an array: numpy reads it (host/reads.py)


@dataclass
class Part:
    """Statements [first, stop) of a region, with the names they take and give."""

    first: int
    stop: int
    ins: tuple[str, ...]
    outs: tuple[str, ...]
    cache: dict[Any, Any] = field(default_factory=dict)  # signature key -> Compiled | DIRECT | EAGER
    host_reason: str | None = None  # set once the part must run on the host
    over_budget: str | None = None  # an island: why its host version runs at its OVER_BUDGET signatures
    jax_ops: list[str] = field(default_factory=list)  # on the host: the ATen ops JAX computed
    in_torch: str | None = None  # on the host: why torch runs it (set once JAX could not)
    captures: int = 0
    # Python int leaves (per input structure) compiled as symbolic inputs, those found to need
    # static values, and the programs captured with symbolic ints, by signature with those ints
    # left out (each checks its guards: `if t > 3:` inside the region, an index's bounds)
    symbolic: dict[Any, frozenset[int]] = field(default_factory=dict)
    static_ints: dict[Any, frozenset[int]] = field(default_factory=dict)
    variants: dict[Any, list[Compiled]] = field(default_factory=dict)
    # per program with symbolic ints (by id), the full signatures it served: an exported host
    # takes ints as constants, so export captures each of those again with its values
    served: dict[int, dict[Any, None]] = field(default_factory=dict)
    # input lists the part only appends to (and gives back): they go in empty, and the host
    # extends the caller's list with what the part appended, so the signature does not grow
    appends: tuple[str, ...] = ()
    # (input, output) positions of names the region changes only in place (RegionSpec.in_place)
    in_place: tuple[tuple[int, int], ...] = ()
    # outputs that hold an input's or another output's list or dict (regions.identities)
    same: tuple[tuple[int, bool, int], ...] = ()
    # (input, output) positions of the names the part takes and gives without rebinding them:
    # where one holds a view, the host rebuilds it after an update (host/view_families.py)
    unbound: tuple[tuple[int, int], ...] = ()
    reads: frozenset[str] = frozenset()  # the inputs its statements read (not only pass through)
    # it changes an input in place (`xs[k] = v`, `xs.append(v)`): where two of its inputs are one
    # list or dict, the host runs it, so the change reaches both names (a program takes two)
    changes: bool = False
    # an island's signatures seen once whose program would hold new int values (host/specialised.py)
    deferred: set = field(default_factory=set)
    # signatures, Python scalar values (numbers, strings) left out, at which the part ran as plain
    # Python (DIRECT) or only moved arrays (CARRIED): a float new at every call (a clock reading, a
    # running score), a counter or a label is no new signature there
    direct_scalars: dict = field(default_factory=dict)  # -> DIRECT | CARRIED

    def staged_nowhere(self) -> bool:
        """An island whose host version has run at every signature so far (emit/ and export
        write its host version alone)."""
        return self.host_reason is not None or self.over_budget is not None \
            and not any(type(e) is Compiled for e in self.cache.values())

    def falls_back(self) -> bool:
        """An island whose host version serves the signatures its programs do not: int values
        seen once (host/specialised.py), or row selections over the dense form's budget."""
        return bool(self.deferred) or self.over_budget is not None


@dataclass
class RegionState:
    spec: RegionSpec
    parts: list[Part]


def _writer(spec: RegionSpec, part: Part, output: int | None) -> int | None:
    """Index in the part of the last statement writing its output number `output` (None: unknown)."""
    if output is None:
        return None
    name = part.outs[output]
    at = [i for i in range(part.first, part.stop) if name in spec.statements[i].outs]
    return at[-1] - part.first if at else None


def _variant(part: Part, key: Any, leaves: list, tree: Any) -> Compiled | None:
    """The program captured with symbolic ints that serves this signature (its guards hold for
    these values), or None."""
    symbolic = part.symbolic.get(tree)
    if symbolic is None:
        return None
    entry = next((c for c in part.variants.get(values.symbolic_key(key, leaves, symbolic), ())
                  if c.guard is None or c.guard(leaves)), None)
    if entry is not None:  # (an exported host captures each signature it served with its values)
        part.served[id(entry)][key] = None
    return entry


def _kept(part: Part, vals: tuple, outs: tuple) -> tuple:
    """A part's outputs with the lists and dicts it changes in place still the caller's objects,
    and one list under two names (`saved = xs`) one object again (both ways of running a part)."""
    if part.in_place:
        outs = kept_in_place(vals, outs, part.in_place)
    return kept_identity(vals, outs, part.same) if part.same else outs


def tracks_views(part: Part) -> bool:
    """Whether a program of the part makes a view the host tracks per call (host/view_families.py):
    an emitted or exported host, which does not, would miss a later update reaching it."""
    entries = [*part.cache.values(), *(e for es in part.variants.values() for e in es)]
    return any(type(e) is Compiled and e.tracked for e in entries)


def _part(spec: RegionSpec, first: int, stop: int) -> Part:
    """Inputs: names read before written inside; outputs: names written that later statements
    of the region, or the code after it, read."""
    sts = spec.statements
    defined: set[str] = set()
    ins: list[str] = []
    for st in sts[first:stop]:
        ins += [n for n in st.ins if n not in defined and n not in ins]
        defined |= set(st.outs)
    later = set(spec.outs).union(*(st.ins for st in sts[stop:]))
    outs = tuple(sorted(defined & later))
    appends = tuple(n for n in ins if n in outs and all(n in st.appends for st in sts[first:stop] if n in st.ins))
    in_place = tuple((ins.index(n), outs.index(n)) for n in outs if n in ins and n in spec.in_place)
    same = identities(sts[first:stop], ins, outs)
    changes = any(n in ins for st in sts[first:stop] for n in set(st.outs) - set(st.binds))
    bound = {n for st in sts[first:stop] for n in st.binds}
    unbound = tuple((ins.index(n), outs.index(n)) for n in outs if n in ins and n not in bound)
    reads = frozenset(n for st in sts[first:stop] for n in st.ins if n not in st.passes)
    return Part(first, stop, tuple(ins), outs, appends=appends, in_place=in_place, same=same, changes=changes,
                unbound=unbound, reads=reads)


class DispatchHost:
    """Runs a dispatch-rewritten method: `host(state values, tensor inputs) -> outputs`."""

    def __init__(self, root: torch.nn.Module, method: str, plan: DispatchPlan, paths: list[str],
                 arg_leaves: list[Any], in_spec: pytree.TreeSpec, tensor_index: list[int], train: bool = False):
        self.root = root
        self.method = method
        self.plan = plan
        self.path_index = {p: i for i, p in enumerate(paths)}
        self.arg_leaves, self.in_spec, self.tensor_index = arg_leaves, in_spec, tensor_index
        # the usual call, f(a, b), needs no pytree rebuilding of its arguments
        self._flat_args = in_spec == pytree.tree_structure(tuple(range(len(arg_leaves))))
        self.bindings = [DispatchPlan.bind(t, self._entry(fn)) for t, fn in plan.dispatch]
        self._whole = self._whole_island(plan)
        self._quick = whole.WholeIsland()  # per signature, the whole-body island's program alone
        self.regions: dict[int, RegionState] = {}
        self.executables: dict[str, Callable] = {}  # graph fingerprint -> shared jitted program
        self.graphs: dict[str, LoweredGraph] = {}  # graph fingerprint -> its lowered graph (for the report)
        # per shared jitted program (id of Compiled.fn): the user's names of its tensor inputs
        # and outputs as the first part that compiled it calls them (for the report)
        self.io_names: dict[int, tuple[list[str], list[str]]] = {}
        self.margin_programs: dict[str, Callable] = {}  # the same, also returning predicate margins
        self.captures = 0
        # the row selections islands compute densely, (file, line) -> Location (for the report)
        self.dense_rows: dict[tuple[str, int], Location] = {}
        self.sites_read: set[str] = set()  # decision sites the host has read a value at (the report's tree)
        # module attributes, and the globals of the model's rewritten code (`COUNTS["n"] += 1`)
        self.attrs = DynamicAttributes(root, [t.fn.__globals__ for t, _ in plan.dispatch]
                                       + attribute_watch.namespaces([root]))
        self.families = Families()  # which arrays of this forward are views of which
        self._state: Sequence[Any] = ()
        self._arg_ids: frozenset[int] = frozenset()  # the current call's argument arrays
        self._region_env: Mapping | None = None
        self._region_st: RegionState | None = None  # the region whose names _region_env holds
        # while a part is captured: the module attributes its statements wrote, as they ran
        self._written: list[tuple[dict, str, Any]] | None = None
        # train mode (host/training.py): regions on batch statistics, writing their buffer updates
        # into the state; a buffer or parameter registered under two names is one state entry
        self.train = train
        self._keys: training.RegionKeys | None = None
        if train:
            self.path_index = training.state_index(root, self.path_index)
            self._buffers = training.model_buffers(root)
        self._module_state = ModuleState(root, self.path_index)
        # of the last traced call: (island label, whether its host version ran), per island call in
        # call order (`run_dispatch_trace` replays them: which names are one array, values seen once)
        self.alias_choices: list[AliasChoice] = []
        # per loop run in chunks (host/chunks.py): the loop as a part, the paths its host loop ran,
        # and the islands its first and later chunks are captured as
        self.chunk_loops: dict[int, tuple[Part, set, RegionSpec, RegionSpec]] = {}
        # the compiled program the latest call of a part on the short way ran (`_compiled_call`):
        # a loop's first chunk program stands for the loop's input signature (host/chunks.py)
        self.last_program: Compiled | None = None

    # ------------------------------------------------------------ calling

    @exclusive  # regions are captured on first use, under torch.export's and the rewrite's global modes
    def __call__(self, state: Sequence[Any], tensors: Sequence[Any]) -> Any:
        if self._quick.ways and self._keys is None and self.root.training == self.train \
                and not self.attrs.slots and not recording_margins():
            outs = self._quick.call(self.regions, id(self._whole[0]), state, tensors)  # type: ignore[index]
            if outs is not whole.MISSED:
                return outs
        leaves = list(self.arg_leaves)
        for i, t in zip(self.tensor_index, tensors):
            # inputs become (or stay) numpy: jitted regions take them directly, as the staged host
            # does, while a device_put first would cost tens of µs per input
            leaves[i] = values.to_host(t) if isinstance(t, torch.Tensor) else t
        args = tuple(leaves) if self._flat_args else pytree.tree_unflatten(leaves, self.in_spec)
        previous, self._state = self._state, state
        traced = recording_margins()
        if traced:
            self.alias_choices = []
        previous_ids, self._arg_ids = self._arg_ids, frozenset(id(leaves[i]) for i in self.tensor_index)
        families, self.families = self.families, Families()
        mode = self.root.training
        if mode != self.train:  # the model runs as converted: eval mode, or train mode with train=True
            self.root.train(self.train)
        try:
            if self._whole is not None and self._keys is None and not traced:
                outs = self._direct(args, tensors)
                if outs is not _MISSED:
                    return outs
            # grad mode on, so that the user's own `with torch.no_grad():` blocks are seen by the
            # regions inside them (their outputs get lax.stop_gradient); host statements run without it
            # (and out of inference mode, whose tensors have no version counter to check updates with)
            with _Calling(self):
                return values.outputs_to_jax(getattr(self.root, self.method)(*args))
        finally:
            self._state, self._arg_ids = previous, previous_ids
            self.attrs.reset()
            self.families = families
            if mode != self.train:
                self.root.train(mode)

    def _whole_island(self, plan: DispatchPlan) -> tuple[RegionSpec, int, list[int | None]] | None:
        """(island, argument count, per island input: None for the module, else the argument's
        position) where the method's whole body is one tail island taking only its parameters."""
        for target, fn in plan.dispatch:
            whole = getattr(fn, "__dycl_whole__", None)
            if target.owner is self.root and target.attr == self.method and whole is not None:
                spec, params = whole
                position = {p: i - 1 for i, p in enumerate(params)}  # params[0] is `self`
                return spec, len(params) - 1, [None if n == params[0] else position[n] for n in spec.ins]
        return None

    def _direct(self, args: tuple, tensors: Sequence[Any]) -> Any:
        """The method's result by one call of its whole-body island's program, or _MISSED (not
        compiled for this signature yet, or it runs on the host): no host Python runs around the
        program, as none would decide anything (a traced call still takes the full way)."""
        spec, count, picks = self._whole  # type: ignore[misc]
        st = self.regions.get(id(spec))
        if st is None or len(args) != count or st.parts[0].host_reason is not None:
            return _MISSED
        vals = tuple(self.root if i is None else args[i] for i in picks)
        # grad=True: the full way calls the method with grad mode on (see `_Calling`)
        outs = self._compiled_call(st.parts[0], vals, grad=True)
        if outs is _MISSED:
            return _MISSED
        self._learn_way(st, vals, picks, tensors)
        return values.outputs_to_jax(defined(outs[0]))

    def _learn_way(self, st: RegionState, vals: tuple, picks: list[int | None], tensors: Sequence[Any]) -> None:
        """Keep the program this call ran as the quick way for its signature (host/whole.py), where
        nothing runs around its call: every input one leaf (the module, or a tensor argument), no
        update of an input, no view tracked, every output the program's own. A signature without
        one is remembered too, so its later calls do not look again."""
        if self._quick.known(tensors):
            return
        part = st.parts[0]
        leaves, _, key = values.call_key(vals, None, True)
        entry = part.cache.get(key)
        order: list[int | None] = [None]
        if type(entry) is Compiled and entry._plain and not (entry.mutated or entry.tracked or entry.conditional) \
                and not (part.appends or part.in_place or part.same or part.changes) and self._flat_args \
                and len(leaves) == len(vals) and all(a is b for a, b in zip(leaves, vals)):
            tensor_of = {i: j for j, i in enumerate(self.tensor_index)}  # argument position -> tensor position
            order = [tensor_of.get(picks[k]) if picks[k] is not None else None for k in entry.tensor_leaves]
        way = None if None in order else whole.Way(st, part, entry, tuple(order))  # type: ignore[arg-type]
        self._quick.learn(tensors, way)

    def train_call(self, state: Sequence[Any], tensors: Sequence[Any], key: Any,
                   updated: Sequence[int]) -> tuple[Any, tuple[Any, ...]]:
        """A train-mode call: (outputs, the state values at `updated` after it). Regions draw
        from `key` and write their buffer updates into a copy of `state` as they run."""
        state = list(state)
        previous, self._keys = self._keys, training.RegionKeys(key)
        try:
            outs = self(state, tensors)
        finally:
            self._keys = previous
        return outs, tuple(state[i] for i in updated)

    def _entry(self, fn: types.FunctionType) -> Callable:
        """A dispatch-rewritten function, callable from torch code too (a host statement)."""
        @functools.wraps(fn)
        def enter(*args: Any, **kwargs: Any) -> Any:
            if not _IN_TORCH.get():
                return fn(*args, **kwargs)
            if jax_ops.active():
                raise jax_ops.NotInJax(f"it calls the converted method {fn.__name__}")
            args, kwargs = values.tree_to_jax((args, kwargs))
            with _land(False):
                return values.tree_to_torch(fn(*args, **kwargs))
        return enter

    def _capture_context(self) -> contextlib.AbstractContextManager:
        stack = contextlib.ExitStack()
        # inside torch.export, regions run as plain Python and user methods as their staged rewrite
        stack.enter_context(executing(None))
        stack.enter_context(_land(False))
        stack.enter_context(patched(self.plan.staged))
        stack.enter_context(staging())
        stack.enter_context(rows.dense())
        stack.enter_context(lifting.lifted(self.root))
        return stack

    # ------------------------------------------------------------ regions

    def run_region(self, spec: RegionSpec, fns: Sequence[Callable], vals: tuple) -> tuple:
        st = self.regions.get(id(spec))
        if st is None:
            st = self.regions[id(spec)] = RegionState(spec, [_part(spec, 0, len(spec.statements))])
        if len(st.parts) == 1 and st.parts[0].ins == spec.ins:
            outs = self._compiled_call(st.parts[0], vals, spec=spec, fns=fns)
            return outs if outs is not _MISSED else self._run_part(st, st.parts[0], fns, vals)
        env = dict(zip(spec.ins, vals))
        self._run_parts(st, list(st.parts), fns, env)
        return tuple(env[n] for n in spec.outs)

    @staticmethod
    def truth(value: Any) -> bool:
        """`bool(value)`; a one-element JAX array is read through numpy (~1 µs) rather than JAX's
        own `__bool__` (~6 µs, more in a loop): a decode loop makes one such read per step."""
        if type(value) is values.JAX_ARRAY and value.size == 1:
            return bool(np.asarray(value).reshape(()))
        return bool(value)

    def run_island(self, spec: RegionSpec, fn: Callable, vals: tuple) -> Any:
        outs = self._island(spec, fn, vals)
        if recording_margins():  # a traced call: the rewritten torch program replays each choice
            self.alias_choices.append((spec.label, outs is NOT_STAGED))
        return outs

    def run_chunked(self, spec: RegionSpec, fn: Callable, vals: tuple, resume: Callable | None = None,
                    after: tuple[Callable, ...] = ()) -> Any:
        """A loop's outputs, a chunk of iterations per program (host/chunks.py), or NOT_STAGED
        where its host loop runs: in train mode (each iteration draws its own keys), and in a
        traced call (the host loop records each decision as torch's program makes it)."""
        if self.train or recording_margins() or (spec.aliased or spec.in_place) and aliased_at_call(spec, vals):
            return NOT_STAGED  # (and where two of its names are one array or list: as for an island)
        loop = self.chunk_loops.get(id(spec))
        if loop is None:  # (the loop as a part: its in-place names and identities, as an island's)
            loop = self.chunk_loops[id(spec)] = (_part(spec, 0, 1), set(), chunks.chunk_spec(spec),
                                                 chunks.resume_spec(spec))
        part, seen, island, later = loop
        return chunks.run(self, spec, (island, later), (fn, resume, after), vals, seen,
                          lambda outs: _kept(part, vals, outs))

    def _island(self, spec: RegionSpec, fn: Callable, vals: tuple) -> Any:
        """The island's outputs, or NOT_STAGED where its host version runs: it failed to stage, two of
        its names are one array at this call, or its int values are new (host/specialised.py)."""
        if (spec.aliased or spec.in_place) and aliased_at_call(spec, vals):
            return NOT_STAGED
        if self.families and any(self.families.member(v) is not None for v in leaves_in_order(vals)):
            # a staged construct's outputs are new arrays: one that stays a view's root or a view
            # on its path would leave the view's family (host/view_families.py); its regions keep it
            return NOT_STAGED
        st = self.regions.get(id(spec))
        if st is None:
            st = self.regions[id(spec)] = RegionState(spec, [_part(spec, 0, 1)])
        part = st.parts[0]
        if part.host_reason is not None:
            return NOT_STAGED
        outs = self._compiled_call(part, vals, spec=spec, fns=(fn,))
        if outs is not _MISSED:
            return outs
        try:
            return self._run_part(st, part, (fn,), vals)
        except (_IslandFailed, specialised.Deferred):
            return NOT_STAGED

    def failed_islands(self) -> frozenset:
        """Labels of the islands that run their host version (at every signature so far)."""
        return frozenset(st.spec.label for st in self.regions.values()
                         if st.spec.kind == "island" and st.parts[0].staged_nowhere())

    def _run_parts(self, st: RegionState, parts: list[Part], fns: Sequence[Callable], env: dict) -> None:
        # names of the split region so far (alias and view checks); a piece of a part split again
        # sees the names the earlier parts of its region computed too
        outer, outer_st = self._region_env, self._region_st
        self._region_env = collections.ChainMap(env, outer) if outer is not None and outer_st is st else env
        self._region_st = st
        try:
            for part in parts:
                outs = self._run_part(st, part, fns, tuple(env[n] for n in part.ins))
                env.update(zip(part.outs, outs))
        finally:
            self._region_env, self._region_st = outer, outer_st

    def _compiled_call(self, part: Part, vals: tuple, grad: bool | None = None,
                       spec: RegionSpec | None = None, fns: Sequence[Callable] = ()) -> Any:
        """The usual call's short way, with `_run_part`'s results: the outputs of the program the
        part compiled for this signature (or, given the region's `spec` and statement `fns`, of its
        statements as Python where the signature holds no tensors or they only move arrays), or
        _MISSED where `_run_part` must run (first calls, host parts, reads, lists one object under
        two names, module attributes). `grad`: the grad mode its signature has (default: torch's now)."""
        if self.attrs.slots or (part.in_place or part.changes) and shared_containers(vals):
            return _MISSED
        given, lists = vals, None
        if part.appends:  # as `appending` runs it: the lists go in empty
            lists = appended_lists(part.ins, part.appends, vals)
            if lists is None:
                return _MISSED
            vals = emptied(part.ins, lists, vals)
        leaves, tree, key = values.call_key(vals, None, grad)
        if self.families:
            key = self.families.keyed(key, leaves)
        entry = part.cache.get(key)
        if entry is None and part.symbolic:
            entry = _variant(part, key, leaves, tree)
        if type(entry) is Compiled and (spec is not None or not entry.mutated):
            if entry.mutated:  # (an update of the caller's own tensor is refused, as on the full way)
                self._check_arguments_kept(spec, part, leaves, entry.mutated)  # type: ignore[arg-type]
            result = entry.run(self._state, leaves)
            self.last_program = entry
            if entry.tracked or self.families and (entry.mutated or entry.conditional):
                result = self._views_after(spec, part, entry, leaves, key, result)  # type: ignore[arg-type]
            outs = result[0]
        elif spec is None or type(entry) is not str:
            return _MISSED
        elif entry == DIRECT:
            outs = run_statements(spec, fns[part.first:part.stop], vals, part.ins, part.outs, part.first)
        elif entry == CARRIED:
            outs = carry(self._body(spec, part, fns), leaves, tree)[0]
        else:
            return _MISSED
        return _kept(part, given, outs if lists is None else extended(part.outs, lists, outs))

    def _run_part(self, st: RegionState, part: Part, fns: Sequence[Callable], vals: tuple) -> tuple:
        shared = shared_containers(vals) if part.in_place or part.changes else []
        # one list under two of its names: a compiled program would take two, the host one
        outs = self._run_shared(st, part, fns, vals, shared) if shared else self._run_part_listed(st, part, fns, vals)
        return _kept(part, vals, outs)

    def _run_shared(self, st: RegionState, part: Part, fns: Sequence[Callable], vals: tuple,
                    shared: list[tuple[int, int]]) -> tuple:
        """This call on the host, its inputs that are one list or dict one object there too."""
        attrs = self.attrs.read() if self.attrs.slots else None
        leaves, tree, _ = values.call_key(vals, attrs)
        outs, new_attrs = self._eager(st.spec, part, fns, leaves, tree, shared)
        if attrs is not None:
            self.attrs.write(new_attrs)
        return outs

    def _run_part_listed(self, st: RegionState, part: Part, fns: Sequence[Callable], vals: tuple) -> tuple:
        if part.appends:
            return appending(part.ins, part.outs, part.appends, vals,
                                    lambda fresh: self._run_part_retried(st, part, fns, fresh))
        return self._run_part_retried(st, part, fns, vals)

    def _run_part_retried(self, st: RegionState, part: Part, fns: Sequence[Callable], vals: tuple) -> tuple:
        while True:
            try:
                return self._run_part_once(st, part, fns, vals)
            except _NewAttributes:
                continue  # the signature now includes the attributes just found: capture again

    def _run_part_once(self, st: RegionState, part: Part, fns: Sequence[Callable], vals: tuple) -> tuple:
        attrs = self.attrs.read() if self.attrs.slots else None
        leaves, tree, key = values.call_key(vals, attrs)
        if self.families:
            key = self.families.keyed(key, leaves)
        entry = part.cache.get(key)
        if entry is None and part.symbolic:
            entry = _variant(part, key, leaves, tree)
        if entry is None and part.direct_scalars and attrs is None:
            got = self._direct_at_new_values(st.spec, part, fns, vals, key)
            if got is not None:
                return got
        if entry is None or entry == READ:
            got = self._read(st.spec, part, vals)
            if got is not reads.NOT_READ:
                part.cache[key] = READ
                return got
        if isinstance(entry, Compiled):
            if entry.mutated:
                self._check_arguments_kept(st.spec, part, leaves, entry.mutated)
            result = entry.run(self._state, leaves)
            if entry.tracked or self.families and (entry.mutated or entry.conditional):
                result = self._views_after(st.spec, part, entry, leaves, key, result)
            outs, new_attrs = result
        elif entry == CARRIED:
            outs, new_attrs = carry(self._body(st.spec, part, fns), leaves, tree)
        elif entry == DIRECT:
            return run_statements(st.spec, fns[part.first:part.stop], vals, part.ins, part.outs, part.first)
        elif entry == OVER_BUDGET:
            raise _IslandFailed()
        elif entry == EAGER or part.host_reason is not None:
            # (on the host for good: one entry per signature less its Python numbers, for the report
            # and emit/, so a value new at every call, a float read with `.item()`, adds none)
            part.cache[key if part.host_reason is None else values.scalars_left_out(key)] = EAGER
            outs, new_attrs = self._eager(st.spec, part, fns, leaves, tree)
        else:
            if st.spec.kind == "island":
                self._admit(part, key)
            else:
                choice = self._admit_floats(part, key)
                if choice == "defer":  # a float value seen once: this call runs the part on the host
                    return self._with_attrs(self._eager(st.spec, part, fns, leaves, tree))
                if choice == "host":
                    part.host_reason = specialised.float_reason()
                    return self._on_host(st, part, fns, leaves, tree, key)
            return self._first_call(st, part, fns, vals, leaves, tree, key)
        if attrs is not None:
            self.attrs.write(new_attrs)
        return outs

    def _views_after(self, spec: RegionSpec, part: Part, entry: Compiled, leaves: list, key: tuple,
                     result: tuple) -> tuple:
        """A program's (outputs, attributes), once it is checked that an update it made reached every
        view it took (host/view_families.py), with the views it made registered."""
        outs, attrs = result
        if entry.mutated and self.families:
            self.families.check(spec, part, leaves, entry.mutated, key[3])
        flat = leaves_in_order(outs) if entry.tracked or entry.conditional else []
        for k, kind, j, layout in entry.tracked:
            self.families.register(flat[k], leaves[j] if kind == "in" else flat[j], layout)
        for j, pair in entry.conditional:
            if self.families.member(leaves[j]) is not None:
                if pair is None:
                    self.families.refuse_view(spec, part.first)
                k, kind, b, layout = pair
                self.families.register(flat[k], leaves[b] if kind == "in" else flat[b], layout)
        return outs, attrs

    @staticmethod
    def _admit_floats(part: Part, key: Any) -> str | None:
        """A region part at a signature that differs from one it has a program for in float values
        only: "defer", "compile" or "host" as for islands' ints (host/specialised.py); else None."""
        programs = [k for k, e in part.cache.items() if type(e) is Compiled and not e.symbolic]
        if not any(specialised.floats_differ(key, k) for k in programs):
            return None
        return specialised.admit(part.deferred, len(programs), key)

    @staticmethod
    def _admit(part: Part, key: Any) -> None:
        """An island at a signature it has no program for: where it has a program for other values
        of the same int inputs only (its programs hold their values), compiled on the signature's
        second call only, and a bounded number of them (host/specialised.py); else its host version
        runs (raises Deferred or _IslandFailed)."""
        programs = [k for k, e in part.cache.items() if type(e) is Compiled and not e.symbolic]
        if not any(specialised.ints_differ(key, k) for k in programs):
            return  # its first program, or new shapes: compiled as before
        choice = specialised.admit(part.deferred, len(programs), key)
        if choice == "defer":
            raise specialised.Deferred()
        if choice == "host":
            part.host_reason = specialised.host_reason()
            raise _IslandFailed()

    @staticmethod
    def _read(spec: RegionSpec, part: Part, vals: tuple) -> Any:
        """A read statement's outputs, read with numpy (host/reads.py), or reads.NOT_READ."""
        form = spec.statements[part.first].read
        if form is None or part.stop - part.first != 1 or spec.kind != "region":
            return reads.NOT_READ
        got = reads.read(form, vals[part.ins.index(form.source)],
                         vals[part.ins.index(form.mask)] if form.mask else None)
        if got is reads.NOT_READ:
            return got
        if part.host_reason is None:
            what = "it reads tensor data into Python" if form.method in ("tolist", "item") \
                else "its size depends on the data"
            how = f"`[{form.mask}]` with a bool mask" if form.method == "mask" else f"`.{form.method}()`"
            part.host_reason = f"{what} ({how}); numpy reads the array"
            # the ATen op it stands for, as a host statement would list it (the report; emit/ and
            # the exported host write a nonzero as numpy code, an `.item()` as Python on the array)
            part.jax_ops = list(reads.OPS[form.method])
        return (got,) if part.outs else ()

    def _body(self, spec: RegionSpec, part: Part, fns: Sequence[Callable]) -> Callable:
        """The part as one function of (values, attribute values) -> (outputs, attribute values)."""
        def body(vals: tuple, attrs: tuple | None) -> tuple:
            if attrs is not None:
                self.attrs.write(attrs)
            # under torch.export, which puts every module attribute back as it was when it returns
            # (and warns only of tensor ones): the writes are seen here, inside the trace
            written = self._written
            before = self.attrs.snapshot() if written is not None else None
            outs = run_statements(spec, fns[part.first:part.stop], vals, part.ins, part.outs, part.first)
            if written is not None:
                written += self.attrs.changed(before)  # type: ignore[arg-type]
            return outs, (self.attrs.read() if attrs is not None else None)
        return body

    def _eager(self, spec: RegionSpec, part: Part, fns: Sequence[Callable], leaves: list, tree: Any,
               shared: Sequence[tuple[int, int]] = ()) -> tuple:
        if any(isinstance(v, jax.core.Tracer) for v in leaves):  # under the user's jax.grad / jit / vmap
            st = spec.statements[part.first]
            raise CallError(
                f"this statement runs on the host ({part.host_reason or 'torch.export refused it'}), so a "
                "JAX transformation (jax.grad, jax.jit, jax.vmap of jm.apply) cannot trace through it",
                location=Location(spec.file, st.line, st.code),
                fix="call the model outside JAX transformations, or write the statement so that torch.export "
                    "captures it (see the report's host statements)")
        before, generators = self.attrs.snapshot(), host_rng.state()
        # train mode: no random draws or buffer updates here (host/training.py)
        guard = training.HostGuard(self._buffers, _first_line(spec, part), part.host_reason) \
            if self.train else contextlib.nullcontext()
        # the user's code reads weights from the torch module: this call's state values, where they differ
        with _land(True), torch.no_grad(), guard, self._module_state.swapped(self._state):
            # (values cross to JAX as arrays: no autograd graph needed)
            watch = None if self.train else self._module_state.watch()
            if part.in_torch is None and jax_ops.calls_higher_order(fns[part.first:part.stop]):
                part.in_torch = "calls a torch higher-order op (torch.cond, while_loop, ...)"
            roots: dict[int, torch.Tensor] = {}  # what the results of view ops view (jax_ops computes copies)
            if part.in_torch is None:  # computed by JAX ops where it can be (host/jax_ops.py)
                torch_leaves, inputs, versions = self._host_inputs(leaves)
                vals, attrs = jax.tree_util.tree_unflatten(tree, torch_leaves)
                vals = rejoined(vals, shared)
                try:
                    (outs, new_attrs), ops = jax_ops.run_in_jax(lambda: self._body(spec, part, fns)(vals, attrs),
                                                                roots)
                    part.jax_ops = sorted(set(part.jax_ops) | set(ops))
                except jax_ops.NotInJax as exc:  # it stopped before any in-place update: run it in torch
                    part.in_torch = str(exc)
                    self.attrs.restore(before)
                    host_rng.restore(generators)  # (and draws again what it drew)
            if part.in_torch is not None:
                torch_leaves, inputs, versions = self._host_inputs(leaves)
                vals, attrs = jax.tree_util.tree_unflatten(tree, torch_leaves)
                outs, new_attrs = self._body(spec, part, fns)(rejoined(vals, shared), attrs)
            if watch is not None:  # eval mode: a buffer updated here would not reach the compiled regions
                self._module_state.refuse_updates(watch, _first_line(spec, part), self._state)
        changed = {id(t) for t, v in zip(inputs, versions) if t._version != v}
        mutated = tuple(i for i, t in enumerate(torch_leaves) if id(t) in changed)
        if mutated and self.families:  # its torch copies share no memory with a view's other arrays
            self.families.refuse_updates(spec, part.first, leaves, mutated)
        self._check_arguments_kept(spec, part, leaves, mutated)
        if mutated and spec.kind == "region":  # as for a compiled part: another name holding the array misses the update
            _check_aliases_kept(spec, part, jax.tree_util.tree_unflatten(tree, leaves)[0], leaves, mutated,
                                self._region_env or {})
        views = view_pairs(torch_leaves, leaves_in_order((outs, new_attrs)), lambda t: roots.get(id(t), t))
        if views:
            _, conditional = check_views_kept(spec, part, vals, leaves, outs, views,
                                              user_locals(self._region_env or {}, (region, island)))
            if any(self.families.member(leaves[j]) is not None for j, _ in conditional):
                self.families.refuse_view(spec, part.first)
        try:
            lost_update(None, inputs, versions, leaves_in_order((outs, new_attrs)))
        except HostValueError as exc:
            st = spec.statements[part.first]
            raise DyclError(f"{os.path.basename(spec.file)}:{st.line}: {exc}", location=Location(spec.file, st.line, st.code),
                            fix="the converter returns every name the statement updates in place, passes to a "
                                "helper function or method of the module, or names in `out=`; this update went "
                                "elsewhere, which no conversion option (host=\"auto\", \"dispatch\" or \"staged\") "
                                "keeps yet: please report it with this line") from None
        changes = self.attrs.changed(before)
        self._refuse_global_changes(changes, before, spec, part)
        self.attrs.register(changes)
        return values.tree_to_host(outs), values.tree_to_host(self.attrs.read())

    def _refuse_global_changes(self, changes: list, before: Any, spec: RegionSpec, part: Part) -> None:
        """Refuse (the globals put back) where running a part changed a global: a helper function
        bumping a counter or filling a list. Captured, the change happens once, when the program
        is traced; and a global is shared with every module that imported it, so no copy carried
        between regions would reach the helpers that read it (the rewrite refuses the changes it
        can see in the method itself, at their line: attribute_stores)."""
        hit = self.attrs.global_changes(changes)
        if not hit:
            return
        self.attrs.restore(before)
        namespace, name = hit[0]
        st, last = spec.statements[part.first], spec.statements[part.stop - 1]
        where = os.path.basename(str(namespace.get("__file__", namespace.get("__name__", "?"))))
        what = "this statement runs (in code it calls)" if st.line == last.line \
            else f"the statements of lines {st.line}-{last.line} run (in code they call)"
        raise DyclError(
            f"{os.path.basename(spec.file)}:{st.line}: global `{name}` of {where} changes while {what}; a "
            "compiled region would change it once, when it is captured, and read the value it had then on every "
            "call", location=Location(spec.file, st.line, st.code),
            fix=f"keep the value of `{name}` in a local variable that the helper returns, or in a module "
                "attribute (`self.<name>`): the converted host carries module attributes from region to region")

    @staticmethod
    def _host_inputs(leaves: list) -> tuple[list, list, list]:
        """Fresh torch copies of the leaves, the tensors among them and their version counters.
        Leaves that are one array (names of one tensor, `a = h`) get one copy, so an in-place
        update through one of them reaches the others, as in torch (a compiled part takes them
        as one tensor too: `values.same_arrays`)."""
        copies: dict[int, Any] = {}
        torch_leaves = [copies.setdefault(id(v), values.to_torch(v)) if isinstance(v, values.ARRAYS)
                        else values.to_torch(v) for v in leaves]
        inputs = list({id(t): t for t in torch_leaves if isinstance(t, torch.Tensor)}.values())
        return torch_leaves, inputs, [t._version for t in inputs]

    def _first_call(self, st: RegionState, part: Part, fns: Sequence[Callable], vals: tuple, leaves: list,
                    tree: Any, key: Any) -> tuple:
        spec = st.spec
        if any(map(values.live, leaves)):  # before any probe or capture: either would consume it
            return self._live_values(st, part, fns, vals, leaves, tree, key, vals, part.ins, "reads")
        if not any(isinstance(v, values.ARRAYS) for v in leaves):
            # no tensor in: run it as Python; if no tensor comes out and no attribute changes, it stays Python
            probe_vals, probe_attrs = jax.tree_util.tree_unflatten(tree, leaves)
            with self._probing() as before:
                watch = None if self.train else self._module_state.watch()
                with _land(True), torch.no_grad():
                    outs, _ = self._body(spec, part, fns)(probe_vals, probe_attrs)
                if watch is not None:  # `self.calls += 1` takes no tensor in, yet updates the module's buffer
                    self._module_state.refuse_updates(watch, _first_line(spec, part), self._state)
                quiet = not self.attrs.changed(before)
            if quiet and not any(isinstance(v, torch.Tensor) for v in leaves_in_order(outs)):
                part.cache[key] = DIRECT
                if _immutable(vals):
                    part.direct_scalars[values.scalars_left_out(key)] = DIRECT
                return run_statements(spec, fns[part.first:part.stop], vals, part.ins, part.outs, part.first)
        elif spec.kind == "region" and not self.train and self._only_moves(spec, part, fns, leaves, tree):
            # e.g. `candidates.append((score + v, toks + [i], h))`: a capture per float value, for nothing
            part.cache[key] = CARRIED
            if _immutable(vals, arrays=True) and not self.attrs.slots:
                part.direct_scalars[values.scalars_left_out(key)] = CARRIED
            return self._with_attrs(carry(self._body(spec, part, fns), leaves, tree))
        if part.stop - part.first > 1:
            k = self._python_prefix(spec, part, fns, leaves, tree)
            if k:  # leading statements of Python values only: they run as Python, before the rest
                return self._split(st, part, fns, vals, [part.first, part.first + k, part.stop])
        torch_args = tuple(jax.tree_util.tree_unflatten(tree, [values.to_torch(v) for v in leaves]))
        # Python ints go in as symbolic ints where the graph allows (see capture/int_inputs.py)
        symbolic = frozenset(int_inputs.candidates(leaves)) - part.static_ints.get(tree, frozenset())
        while True:
            try:
                entry, outs, new_attrs = self._capture(spec, part, fns, leaves, tree, torch_args, symbolic,
                                                        key[3])
            except _NewAttributes:
                raise
            except Exception as exc:  # noqa: BLE001  (classified below; our own bugs are re-raised)
                if isinstance(exc, (AliasedUpdateError, InputMutationError)) \
                        and not (spec.kind == "island" and isinstance(exc, StagedAliasError)):
                    raise  # its host version could not keep the update either (an island's construct in Python can)
                if isinstance(exc, OverBudget) and spec.kind == "island":
                    # at this signature only: a smaller one (fewer rows) keeps its dense program
                    part.cache[key] = OVER_BUDGET
                    part.over_budget = str(exc).split("\n")[0]
                    raise _IslandFailed() from exc
                if isinstance(exc, host_rng.Drawn):  # Python draws on every call where the part runs on the host
                    if spec.kind == "island":
                        part.host_reason = str(exc)
                        raise _IslandFailed() from exc
                    failure = exc
                    break
                if raised_by_us(exc):
                    raise  # our bug: never a retry, an island's host version or a split
                # a lowering may need one of the ints as a value: try again with them constant (no help
                # where the shape comes from tensor data: that export would fail the same way)
                if symbolic and not values.data_dependent(exc):
                    part.static_ints[tree] = part.static_ints.get(tree, frozenset()) | symbolic
                    symbolic = frozenset()
                    continue
                # whatever stops an island from staging, its host version is exact (save a dtype JAX lacks)
                if spec.kind == "island" and not values.unholdable(exc):
                    part.host_reason = values.describe_failure(exc)
                    raise _IslandFailed() from exc
                values.reraise_if_internal(exc)
                failure = exc
            else:
                failure = None
            break
        if failure is not None:  # outside the handler: the pieces' own failures must not chain to this one
            return self._fall_back(st, part, fns, vals, leaves, tree, key, failure)
        if any(map(values.live, leaves_in_order(outs))):  # the program would give the trace's one object on every call
            return self._live_values(st, part, fns, vals, leaves, tree, key, outs, part.outs, "makes")
        if entry.views:
            try:
                entry.tracked, entry.conditional = check_views_kept(
                    spec, part, vals, leaves, outs, entry.views, user_locals(self._region_env or {}, (region, island)),
                    entry.view_layouts, entry.mutated)
            except AliasedUpdateError:
                if not entry.symbolic or None not in entry.view_layouts:
                    raise
                # a view at a symbolic offset (`w = v[i]`) has no one layout: captured again
                # with the ints constant, one program per value
                part.static_ints[tree] = part.static_ints.get(tree, frozenset()) | frozenset(entry.symbolic)
                return self._first_call(st, part, fns, vals, leaves, tree, key)
        if entry.symbolic:
            self._add_variant(part, tree, key, leaves, entry)
        else:
            part.cache[key] = entry
        self._check_arguments_kept(spec, part, leaves, entry.mutated)
        if entry.mutated and spec.kind == "region":
            _check_aliases_kept(spec, part, vals, leaves, entry.mutated, self._region_env or {})
        if entry.tracked or self.families and (entry.mutated or entry.conditional):
            outs, new_attrs = self._views_after(spec, part, entry, leaves, key, (outs, new_attrs))
        if new_attrs is not None:
            self.attrs.write(new_attrs)
        return outs

    def _capture(self, spec: RegionSpec, part: Part, fns: Sequence[Callable], leaves: list, tree: Any,
                 torch_args: tuple, symbolic: frozenset[int],
                 same: tuple[tuple[int, int], ...] = ()) -> tuple[Compiled, Any, Any]:
        """Capture, compile and run the part once; the int leaves in `symbolic` are exported as
        symbols, less those the graph needs as values (captured again without them)."""
        while True:
            part.captures += 1
            self.captures += 1
            before = self.attrs.snapshot()
            # the method's whole-body island: what it writes to a module attribute no later code of
            # this call reads (the host puts attributes back after each call), so it stays no slot
            whole_body = self._whole is not None and spec is self._whole[0]
            self._written = None if whole_body else []
            generators = host_rng.state()
            try:
                callers = frozenset(i for i, v in enumerate(leaves) if id(v) in self._arg_ids)
                cap = capture_call(self.root, self._body(spec, part, fns), torch_args, self._capture_context, callers,
                                   same, symbolic, leaf_view=values.open_closures, train=self.train,
                                   dense_budget=dense_rows_budget())
                if [i for i in cap.inputs if i not in symbolic] != [i for i, v in enumerate(leaves)
                                                                    if isinstance(v, values.ARRAYS)]:
                    raise AssertionError("a captured region's tensor inputs are not the host's array leaves")
            finally:
                changes = self.attrs.changed(before) + (self._written or [])
                self._written = None
                self.attrs.restore(before)
                which = host_rng.restore(generators)
            if which is not None:  # the program would hold the one number drawn: the part runs in Python
                raise host_rng.Drawn(f"it {host_rng.effect(which)}, whose one value at capture a compiled "
                                     "program would hold")
            self._refuse_global_changes(changes, before, spec, part)
            if self.attrs.register(changes):
                raise _NewAttributes()
            if cap.ints is None or not cap.ints.static:
                break
            # a shape (or a result the host cannot recompute) depends on these ints: they stay constants
            # (those torch specialised to this value may be symbols at another: not remembered)
            part.static_ints[tree] = part.static_ints.get(tree, frozenset()) | (cap.ints.static - cap.ints.specialised)
            symbolic = symbolic - cap.ints.static
        entry = self._compile(spec, cap, leaves)
        self.dense_rows.update(((loc.file, loc.line), loc) for loc in cap.bounded_rows)
        if cap.ints is None and not self.train:
            entry.captured = cap
        self.io_names.setdefault(id(entry.fn), (_leaf_names(part.ins, tree, entry.tensor_leaves), list(part.outs)))
        outs, new_attrs = entry.run(self._state, leaves)
        # (an output a path leaves unassigned is an Undefined, which fails on any attribute read)
        jax.block_until_ready([v for v in leaves_in_order(outs) if isinstance(v, jax.Array)])
        return entry, outs, new_attrs

    @staticmethod
    def _add_variant(part: Part, tree: Any, key: Any, leaves: list, entry: Compiled) -> None:
        """File a program captured with symbolic ints under the signature without their values."""
        symbolic = frozenset(entry.symbolic)
        if part.symbolic.get(tree) != symbolic:  # (programs filed under another set are not found again)
            part.symbolic[tree] = symbolic
        found = part.variants.setdefault(values.symbolic_key(key, leaves, symbolic), [])
        found.append(entry)
        part.cache[("variant", id(entry))] = entry  # listed with the part's other signatures (report)
        part.served[id(entry)] = {key: None}

    def _direct_at_new_values(self, spec: RegionSpec, part: Part, fns: Sequence[Callable], vals: tuple,
                              key: Any) -> tuple | None:
        """The outputs of a part that ran as plain Python (DIRECT) or only moved its arrays (CARRIED)
        at a signature differing from this one in Python scalar values only: run once so again (its
        inputs immutable: nothing to put back), where it again gives no tensor, reads no array and
        changes no module attribute or buffer; else None (the first-call path runs it). Cached
        only up to DIRECT_ENTRIES signatures: a clock reading would add one at every call."""
        kind = part.direct_scalars.get(values.scalars_left_out(key))
        if kind is None or not _immutable(vals, arrays=kind == CARRIED):
            return None
        before = self.attrs.snapshot()
        watch = None if self.train else self._module_state.watch()
        try:
            with _land(True), torch.no_grad():
                if kind == DIRECT:
                    outs = run_statements(spec, fns[part.first:part.stop], vals, part.ins, part.outs, part.first)
                else:
                    leaves, tree, _ = values.call_key(vals, None)
                    outs, _ = carry(self._body(spec, part, fns), leaves, tree)
        except Exception:  # noqa: BLE001
            if kind == DIRECT:
                raise  # the user's statement fails here, as in torch
            # with stand-ins for arrays any failure may be theirs (`n < 4` of an array, at these values
            # only: fuzz seed 449806009): the first-call path captures it, and raises there if the user's code does
            outs = None
        if watch is not None:
            self._module_state.refuse_updates(watch, _first_line(spec, part), self._state)
        if outs is None or self.attrs.changed(before) \
                or any(isinstance(v, torch.Tensor) for v in leaves_in_order(outs)):
            self.attrs.restore(before)
            return None
        if len(part.cache) < DIRECT_ENTRIES:  # values met again (a step counter) take the short way
            part.cache[key] = kind
        return outs

    def _python_prefix(self, spec: RegionSpec, part: Part, fns: Sequence[Callable], leaves: list, tree: Any) -> int:
        """How many leading assignments (not all) take and give only plain Python values here
        and change no module attribute: e.g. `n = sum([l > t for l in lengths])` before the
        tensor statements that slice with `n`. Run as Python, they give the rest ints that
        are constants or symbols of its own, not values of a whole list."""
        vals, _ = jax.tree_util.tree_unflatten(tree, leaves)  # fresh containers: the probe must not change the caller's
        env = dict(zip(part.ins, vals))
        k = 0
        try:
            with self._probing() as before, _land(True), torch.no_grad():
                for st, fn in zip(spec.statements[part.first:part.stop - 1], fns[part.first:part.stop - 1]):
                    args = [env[n] for n in st.ins]
                    # only immutable Python values in (ints, strings, lists of them as fresh copies):
                    # then running it once more for real can change nothing the probe touched
                    if not st.outs or not all(type(v) in values.PLAIN for v in leaves_in_order(args)):
                        break
                    outs = fn(*args)
                    if not all(type(v) in values.PLAIN for v in leaves_in_order(outs)) \
                            or self.attrs.changed(before):
                        break
                    env.update(zip(st.outs, outs))
                    k += 1
        except Exception as exc:  # noqa: BLE001  (the statement raises again where it really runs)
            if raised_by_us(exc):
                raise  # our bug, not the user's statement failing on these values
        return k

    def _check_arguments_kept(self, spec: RegionSpec, part: Part, leaves: list, mutated: tuple[int, ...]) -> None:
        """Refuse an in-place update of the caller's own tensor: torch would change it, we cannot."""
        hit = [i for i in mutated if id(leaves[i]) in self._arg_ids]
        if not hit:
            return
        first, last = spec.statements[part.first], spec.statements[part.stop - 1]
        where = f"the statement at line {first.line} updates" if first.line == last.line \
            else f"a statement in lines {first.line}-{last.line} updates"
        raise InputMutationError(
            f"{os.path.basename(spec.file)}:{first.line}: {where} an input of the method in place "
            f"({leaves[hit[0]].dtype}{list(leaves[hit[0]].shape)}); converted models are pure functions and cannot change the caller's tensors",
            location=Location(spec.file, first.line, first.code),
            fix="update a copy (e.g. `x = x.clone()` before the in-place update) and return it")

    def _compile(self, spec: RegionSpec, cap: Any, leaves: list) -> Compiled:
        gm = cap.ep.graph_module
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        n_state = len(cap.state)
        # torch.export lifts every parameter of the model: pass only those the region reads
        used = [i for i in range(n_state) if placeholders[i].users]
        # 64-bit integers where an int64 value may leave int32, or one arrives (lower/dtypes.py)
        ints = cap.ints.leaves if cap.ints is not None else ()
        # a symbolic int arrives within [0, int32 max] (values.symbolic_key)
        given = [e.tensor for e in cap.state] + [(0, values.INT32_MAX) if i in ints else None for i in cap.inputs]
        wide = any(np.dtype(v.dtype) == np.int64 for v in leaves if isinstance(v, values.ARRAYS)) \
            or int64_verdict(gm, given).wide
        with int_scope(wide):
            return self._build(spec, cap, leaves, placeholders, n_state, used, wide)

    def _build(self, spec: RegionSpec, cap: Any, leaves: list, placeholders: list, n_state: int, used: list[int],
               wide: bool) -> Compiled:
        gm = cap.ep.graph_module
        graph_fp = graph_fingerprint(gm, n_state) + (":x64" if wide else "")
        fn = self.executables.get(graph_fp)
        if fn is None and not cap.mutations and all(n.op in ("placeholder", "output") for n in gm.graph.nodes):
            fn = _passthrough(placeholders, used, n_state, gm)  # nothing to compute: no XLA call
        elif fn is None:
            graph = self.graphs[graph_fp] = LoweredGraph.build(gm, name=spec.label)

            def run(state: list, tensors: list, call: Callable = graph, used: list = used) -> tuple:
                full: list[Any] = [None] * n_state
                for i, v in zip(used, state):
                    full[i] = v
                return call(*full, *tensors)

            # the same, also returning each predicate output's margin: compiled only if jm.trace runs
            margins = functools.partial(run, call=graph.with_margins)
            if self.train:  # random ops draw from the region call's key (host/training.py)
                run, margins = training.keyed(run), training.keyed(margins)
            fn = self.executables[graph_fp] = jax.jit(run)
            self.margin_programs[graph_fp] = jax.jit(margins)
        sources: list[tuple[bool, Any]] = []
        for entry in (cap.state[i] for i in used):
            if entry.kind != "constant" and entry.path in self.path_index:
                sources.append((True, self.path_index[entry.path]))
            else:
                sources.append((False, values.to_jax(entry.tensor)))
        ints = cap.ints or int_inputs.SymbolicInts((), frozenset())
        margins = self.margin_programs.get(graph_fp)
        if self.train and fn is self.executables.get(graph_fp):  # not a passthrough: keyed, and it may update buffers
            targets = training.update_targets(cap.mutations, self.path_index, spec.label)
            fn, margins = training.Updating(self, fn, targets), training.Updating(self, margins, targets, margins=True)
        return Compiled(fn, sources, list(cap.inputs), cap.out_tree, cap.slots, cap.constants, cap.mutated,
                        cap.passed if any(p is not None for p in cap.passed) else None,
                        not torch.is_grad_enabled(), wide, margins, ints.guard,
                        ints.results, ints.leaves, views=cap.views, view_layouts=cap.view_layouts)

    def _fall_back(self, st: RegionState, part: Part, fns: Sequence[Callable], vals: tuple, leaves: list,
                   tree: Any, key: Any, exc: BaseException) -> tuple:
        n = part.stop - part.first
        if n == 1:
            part.host_reason = values.describe_failure(exc)
            return self._on_host(st, part, fns, leaves, tree, key)
        # split where it failed (the statement in the traceback), else in halves, and run the pieces
        k = values.failing_statement(exc, fns[part.first:part.stop])
        if k is None:
            k = _writer(st.spec, part, getattr(exc, "output", None))
        cuts = [part.first, part.first + k, part.first + k + 1, part.stop] if k is not None \
            else [part.first, part.first + n // 2, part.stop]
        return self._split(st, part, fns, vals, cuts)

    def _on_host(self, st: RegionState, part: Part, fns: Sequence[Callable], leaves: list, tree: Any,
                 key: Any) -> tuple:
        part.cache[key] = EAGER
        return self._with_attrs(self._eager(st.spec, part, fns, leaves, tree))

    def _with_attrs(self, result: tuple) -> tuple:
        """The outputs of a part's (outputs, module attribute values), the attributes written back."""
        outs, new_attrs = result
        if self.attrs.slots:
            self.attrs.write(new_attrs)
        return outs

    def _live_values(self, st: RegionState, part: Part, fns: Sequence[Callable], vals: tuple, leaves: list,
                     tree: Any, key: Any, named: Sequence[Any], names: Sequence[str], verb: str) -> tuple:
        """A part that reads (`verb`) or makes an iterator or dict view (`values.live`) among the
        values `named` of `names`: each statement that does runs on the host, in torch (its JAX ops
        could stop half way and be run again, reading the iterator twice), and the rest as usual.
        So a partly consumed iterator goes on where Python left it, and no key holds its id."""
        reason = f"it {verb} a Python iterator or dict view, which a compiled program could only hold as a constant"
        if st.spec.kind == "island":  # its host version runs the statements as Python
            part.host_reason = reason
            raise _IslandFailed()
        held = {n for n, v in zip(names, named) if any(map(values.live, leaves_in_order(v)))}
        sts = st.spec.statements
        at = [i for i in range(part.first, part.stop) if held & set(sts[i].ins if verb == "reads" else sts[i].outs)]
        if part.stop - part.first == 1 or not at:
            part.host_reason, part.in_torch = reason, reason
            return self._on_host(st, part, fns, leaves, tree, key)
        return self._split(st, part, fns, vals, sorted({part.first, part.stop, *at, *(i + 1 for i in at)}))

    def _only_moves(self, spec: RegionSpec, part: Part, fns: Sequence[Callable], leaves: list, tree: Any) -> bool:
        """Whether the part only moves its arrays here (`carried.only_moves`) and changes no module attribute."""
        with self._probing() as before:
            with _land(True), torch.no_grad():
                moves = only_moves(self._body(spec, part, fns), leaves, tree)
            try:
                return moves and not self.attrs.changed(before)
            except StandUsed:  # reading a module attribute met a stand-in: the part stores an array there
                return False

    @contextlib.contextmanager
    def _probing(self) -> Iterator[Any]:
        """Around a probe run of a part: the module attributes and the random generators put back
        after it (so the real run draws the numbers torch's would); yields the attribute snapshot."""
        before, generators = self.attrs.snapshot(), host_rng.state()
        try:
            yield before
        finally:
            self.attrs.restore(before)
            host_rng.restore(generators)

    def _split(self, st: RegionState, part: Part, fns: Sequence[Callable], vals: tuple, cuts: list[int]) -> tuple:
        """Replace `part` by its pieces between `cuts` for good, and run them."""
        pieces = [_part(st.spec, a, b) for a, b in zip(cuts, cuts[1:]) if b > a]
        i = st.parts.index(part)
        st.parts[i:i + 1] = pieces
        env = dict(zip(part.ins, vals))
        self._run_parts(st, pieces, fns, env)
        return tuple(env[n] for n in part.outs)

    # ------------------------------------------------------------ statistics

    def compilations(self) -> int:
        """XLA executables built so far (one per distinct graph and input shapes)."""
        return sum(fn._cache_size() for fn in self.executables.values())
