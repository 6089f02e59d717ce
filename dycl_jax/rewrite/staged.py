"""Emitting torch.cond / torch.while_loop under torch.export for the runtime operators.

Each branch (loop body) is traced once into a graph by `materialize_as_graph`, with its
inputs and the model state as explicit operands; the graph's outputs tell the output plan
(shapes, dtypes, Python values). torch re-traces branch functions several times while
exporting (functionalization, schema), so the branch passed to the HOP only replays that
graph: the user's Python runs once per branch however deep the nesting. A branch graph takes
as inputs only the model state it reads (lazy_state.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch._higher_order_ops.cond import cond_op
from torch._higher_order_ops.utils import materialize_as_graph
from torch._higher_order_ops.while_loop import while_loop_op
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
from torch.utils._mode_utils import no_dispatch

from dycl_jax.errors import DyclError, StagedAliasError, limitation, raised_by_us
from dycl_jax.rewrite import attribute_watch, constants, lazy_state, lifting, modes, names, padding, plan as plans, state_writes
from dycl_jax.rewrite.sites import ON_DISPATCH, Site


@dataclasses.dataclass
class Traced:
    """One branch traced to a graph; `values` are its outputs as traced (metadata only)."""

    gm: torch.fx.GraphModule
    flat: list[Any]  # output leaves: traced tensors, or the Python values the branch returned
    spec: pytree.TreeSpec
    inputs: list[int]  # the operand (Operands.tensors index) each placeholder of gm stands for
    writes: list[int] = dataclasses.field(default_factory=list)  # state slots the branch rebound (state_writes.py)

    @property
    def values(self) -> Any:
        return pytree.tree_unflatten(self.flat, self.spec)

    def replay(self, ops: tuple[torch.Tensor, ...]) -> Any:
        """Run the graph on new operands (every operand); node metadata (user stack traces) is kept."""
        return self.replay_all(ops)[0]

    def replay_all(self, ops: tuple[torch.Tensor, ...]) -> tuple[Any, dict[int, torch.Tensor]]:
        """(the branch's values, the new value of each state slot it wrote) on new operands."""
        with fx_traceback.preserve_node_meta():
            tensors = torch.fx.Interpreter(self.gm).run(*(ops[i] for i in self.inputs))
        it = iter(tensors)
        values = pytree.tree_unflatten([next(it) if isinstance(v, torch.Tensor) else v for v in self.flat], self.spec)
        return values, dict(zip(self.writes, it))


class Operands:
    """Values split into tensor operands (inputs, then model state) and Python leaves.

    Each tensor object is one operand, however often it appears (a parameter passed as an
    argument is also model state): export names subgraph inputs after them, once each.
    A constant-built tensor (constants.py) is no operand but made afresh in each trace, so the
    branch still decides its tests on it while tracing, as the eager mirror does; except in the
    first `carried` groups (a loop's carry, which changes from one iteration to the next).
    """

    def __init__(self, *groups: tuple, carried: int = 0) -> None:
        self.groups = []
        self.same: list[list[tuple[int, int]]] = []  # per group: (position, earlier position of that object)
        self.tensors: list[torch.Tensor] = []
        self._where: dict[int, int] = {}
        for g, values in enumerate(groups):
            leaves, spec = plans.flatten(values)
            pos, fresh = [], []
            for i, v in enumerate(leaves):
                if isinstance(v, torch.Tensor):
                    c = constants.value(v) if g >= carried else None
                    if c is None:
                        pos.append((i, self._operand(v)))
                    else:
                        fresh.append((i, id(v), constants.ConstTensor(c)))
            self.groups.append((leaves, spec, pos, fresh))
            # one list (dict) under two names (`saved = xs`) is rebuilt as one object: an append
            # through one name reaches the other inside the branch, as in Python
            self.same.append([(j, i) for j, v in enumerate(values) if type(v) in (list, dict)
                              for i in range(j) if values[i] is v])
        self.n_user = len(self.tensors)
        self.writes: dict[int, torch.Tensor] = {}  # slot -> new value, from the last call
        self.slots, index, state = lifting.current()
        self.index = [self._operand(state[i]) for i in index]

    def _operand(self, t: torch.Tensor) -> int:
        if id(t) not in self._where:
            self._where[id(t)] = len(self.tensors)
            self.tensors.append(t)
        return self._where[id(t)]

    def names(self, inputs: tuple[str, ...]) -> list[str | None]:
        """Per operand, the user variable of the first group it comes from (`xs[1]` for a leaf of
        a list); None for model state. Where `inputs` does not name the group: None too."""
        out: list[str | None] = [None] * len(self.tensors)
        leaves, spec, pos, _ = self.groups[0] if self.groups else ([], None, [], [])
        if spec is None or spec.num_children != len(inputs):
            return out
        owner: list[str] = []
        for name, child in zip(inputs, spec.children_specs):
            n = child.num_leaves
            owner += [name] if n == 1 and child.is_leaf() else [f"{name}[{k}]" for k in range(n)]
        for i, k in pos:
            if k < self.n_user and out[k] is None and i < len(owner):
                out[k] = owner[i]
        return out

    def call(self, fn: Callable, ops: tuple[torch.Tensor, ...]) -> Any:
        """fn(*group0, *group1, ...) on values rebuilt from operands, with the state swapped in."""
        args: list[Any] = []
        made: dict[int, torch.Tensor] = {}  # one fresh constant per tensor object: aliases stay aliases
        for (leaves, spec, pos, fresh), same in zip(self.groups, self.same):
            rebuilt = list(leaves)
            for i, k in pos:
                rebuilt[i] = ops[k]
            for i, key, c in fresh:
                if key not in made:
                    made[key] = c.make()
                rebuilt[i] = made[key]
            group = list(pytree.tree_unflatten(rebuilt, spec))
            for j, i in same:
                group[j] = group[i]
            args.extend(group)
        with lifting.swapped(self.slots, self.index, ops), state_writes.in_branch() as written:
            out = fn(*args)
            # the new values of the slots the branch wrote (train-mode BatchNorm statistics)
            self.writes = {s: c[k] for s, (c, k) in enumerate(self.slots) if (id(c), k) in written}
            return out


_TRACING = [0]  # branches and loop bodies being traced into graphs now (nested ones count each)


def in_construct() -> bool:
    """Whether the code running now is a staged branch or loop body being traced."""
    return _TRACING[0] > 0


def trace(fn: Callable, operands: Operands, site: Site) -> Traced:
    """Trace `fn` (called through `operands`) into a graph of the operand tensors it reads.

    The model state goes in as probes (lazy_state.py), and the graph's inputs are the user
    operands and the state it read. Should that trace fail in any way, the branch is traced
    again with every state tensor an input, which fails (or not) as torch decides.
    """
    n = operands.n_user
    side: dict[str, Any] = {}

    def raw(*ops: torch.Tensor) -> list[torch.Tensor]:
        if len(ops) == n:  # the state stands in as probes
            side["probes"] = lazy_state.probes(operands.tensors[n:])
            ops = (*ops, *side["probes"])
        flat, spec = plans.flatten(tuple(operands.call(fn, ops)))
        writes = operands.writes
        side["flat"], side["spec"], side["writes"] = flat, spec, sorted(writes)
        return [v for v in flat if isinstance(v, torch.Tensor)] + [writes[s] for s in sorted(writes)]

    _TRACING[0] += 1
    watch = attribute_watch.snapshot(lifting.roots())
    try:
        try:
            gm: torch.fx.GraphModule | None = materialize_as_graph(raw, tuple(operands.tensors[:n]))
        except DyclError:
            raise
        except Exception:  # torch's refusal (or the user's code failing): as torch decides, with plain inputs
            gm = None
        if gm is not None:
            inputs = list(range(n)) + lazy_state.lift(gm, side["probes"], n)
        else:
            gm = materialize_as_graph(raw, tuple(operands.tensors))
            inputs = list(range(len(operands.tensors)))
    finally:
        _TRACING[0] -= 1
    attribute_watch.refuse_changes(watch, site)
    _inline_scalar_constants(gm)
    return Traced(gm, side["flat"], side["spec"], inputs, side["writes"])


def _inline_scalar_constants(gm: torch.fx.GraphModule) -> None:
    """`torch.tensor(<number>)` in a branch (a flag a block returns) becomes `aten.full`: torch
    cannot re-trace a cond or while_loop branch that holds a tensor constant while it decomposes
    the program ("FunctionalTensor on its own")."""
    lift = torch.ops.aten.lift_fresh_copy.default
    for node in list(gm.graph.nodes):
        if not (node.target is lift and node.args[0].op == "get_attr"):
            continue
        const = getattr(gm, node.args[0].target, None)
        if not isinstance(const, torch.Tensor) or const.numel() != 1:
            continue
        with no_dispatch():  # a real tensor: read it without tracing the read
            value = const.item()
        with gm.graph.inserting_before(node):
            full = gm.graph.call_function(torch.ops.aten.full.default, (list(const.shape), value),
                                          {"dtype": const.dtype, "device": const.device})
        full.meta = dict(node.meta)
        node.replace_all_uses_with(full)
        gm.graph.erase_node(node)
    for node in list(gm.graph.nodes):
        if node.op == "get_attr" and not node.users and isinstance(getattr(gm, node.target, None), torch.Tensor):
            gm.graph.erase_node(node)
            delattr(gm, node.target)
    gm.recompile()


def _pure(site: Site, written: Any, values: dict[str, Any]) -> bool:
    """The construct updates no tensor in place (none the analysis sees, `owned`, holds a tensor
    in `values`, the names' values at the construct: `n += 1` of a Python int is no update; one
    the analysis misses is refused, operators._unowned_updates_refused) and no model state: its
    graph reads values only, so operands that share memory may be passed as copies. Where it
    updates one, torch's own refusal of aliased operands stands (operators' alias checks do not
    see into every container, `xs[0]` of a list holding `v` beside `w = v.t()`)."""
    return not written and not any(n not in values or any(isinstance(leaf, torch.Tensor)
                                                           for leaf in pytree.tree_leaves(values[n]))
                                   for n in site.owned)


def _refuse_eval_writes(site: Site, ops: Operands, written: Any) -> None:
    """A construct that updates a buffer or tensor attribute outside training mode: torch keeps the
    value for the next call, a converted model starts each call from the values at conversion
    (the eager check of capture/state_updates.py sees only the example's path)."""
    if not written or any(r.training for r in lifting.roots()):
        return  # train mode: BatchNorm statistics, returned as state updates
    key = ops.slots[sorted(written)[0]][1]
    raise DyclError(
        f"{site.construct}: a path updates the model's tensor `{key}` in place in eval mode: torch keeps the new "
        "value for the next call, while a converted model starts every call from the values at conversion",
        location=site.location,
        fix=limitation(f"in-place updates of the model's own tensors (`{key}`) outside training mode",
                       "dycl_jax/rewrite/staged.py, _refuse_eval_writes"))


def _views_refused(site: Site, what: str) -> StagedAliasError:
    """Refuse a construct that updates a tensor in place while `what` holds (one tensor a view
    of another): a staged construct takes them as separate arrays."""
    return StagedAliasError(
        f"{site.construct}: it updates a tensor in place, and {what} (a view: slicing, `.view`, `.t()`); "
        "torch's update through one reaches the other, a staged construct takes them as separate arrays",
        location=site.location, fix=ON_DISPATCH)


def _memory(t: torch.Tensor) -> Any:
    """What identifies `t`'s memory: its storage (every view shares it), else its base tensor."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # a tensor without storage (a subclass)
        return id(t._base if t._base is not None else t)


def _sharing(tensors: list[torch.Tensor]) -> bool:
    """Whether two of `tensors` share memory."""
    return len({_memory(t) for t in tensors}) < len(tensors)


def _apart(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """`tensors`, each that shares memory with an earlier one (a view of it: `v.view(-1)`,
    `v[:, :3]`, `v.t()`) replaced by a copy: torch.cond and torch.while_loop refuse operands that
    alias. (Copies are free once lowered: a JAX array is never updated in place.)"""
    seen: set[Any] = set()
    out = []
    for t in tensors:
        key = _memory(t)
        out.append(t.clone() if key in seen else t)
        seen.add(key)
    return out


def choice(site: Site, preds: list[torch.Tensor], indices: list[int], fns: list[Callable], inputs: tuple,
           placeholders: str) -> tuple[plans.Plan, list[torch.Tensor]]:
    """torch.cond (two paths) or a chain of torch.cond on a branch index (elif chains)."""
    ops = Operands(inputs)
    traced = [trace(fn, ops, site) for fn in fns]
    values = [t.values for t in traced]
    plan, pads = padding.unify(site, values, placeholders) if site.pad else (plans.build(site, values, placeholders), None)
    written = sorted({s for t in traced for s in t.writes})  # state slots some branch updates
    _refuse_eval_writes(site, ops, written)
    if plan.n_tensors == 0 and not written:
        return plan, []
    names.record(site.label, plan.tensor_names(site))

    # operands some branch reads (most model state is not), and the state a branch may update
    keep = sorted(set(_used(traced, 0)) | {ops.index[s] for s in written})
    kept = [ops.tensors[i] for i in keep]
    if _pure(site, written, dict(zip(site.inputs, inputs))):
        kept = _apart(kept)
    elif _sharing(kept):
        raise _views_refused(site, "two of the tensors it reads share memory")
    given = [ops.names(site.inputs)[i] for i in keep]
    names.record_inputs(site.label, given if len(fns) == 2 and site.kind != "elif" else ["(path index)", *given])

    def branch(t: Traced, skip: int) -> Callable:
        def run(*o: torch.Tensor) -> list[torch.Tensor]:
            full = _expand(ops.tensors, keep, o[skip:])
            values, writes = t.replay_all(full)
            # a branch may not return its operand: the slots it left alone come back as copies;
            # torch.cond wants the paths' strides equal (a view passed on keeps its own)
            return ([v.contiguous() for v in plan.flatten(padding.apply(pads, tuple(values)))]
                    + [writes[s] if s in writes else full[ops.index[s]].clone() for s in written])
        if pads is None and not written:
            _describe(run, t, plan, keep, skip)
        return run

    def finish(outs: list[torch.Tensor]) -> tuple[plans.Plan, list[torch.Tensor]]:
        n = len(outs) - len(written)
        for s, value in zip(written, outs[n:]):
            state_writes.write(*ops.slots[s], value)
        return plan, outs[:n]

    if len(fns) == 2 and site.kind != "elif":
        return finish(list(cond_op(preds[0], branch(traced[0], 0), branch(traced[1], 0), tuple(kept))))
    # idx = the first path whose predicate holds; then cond(idx == i, path i, rest of the chain)
    idx = torch.full((), indices[-1], dtype=torch.int64)
    for p, i in zip(reversed(preds), reversed(indices[:-1])):  # preds: all but the default path
        idx = torch.where(p, torch.full((), i, dtype=torch.int64), idx)
    branches = [branch(t, 1) for t in traced]

    def chain(k: int) -> Callable:
        if k == len(fns) - 1:
            return branches[k]
        return lambda *o: list(cond_op(o[0] == indices[k], branches[k], chain(k + 1), o))

    return finish(list(chain(0)(idx, *kept)))


def loop(site: Site, test_fn: Callable, body_fn: Callable, carry: tuple, invariants: tuple,
         as_pred: Callable[[Any], torch.Tensor]) -> tuple[plans.Plan, list[torch.Tensor]]:
    """torch.while_loop; the carry plan is found by tracing the body until it settles."""
    plan: plans.Plan | None = None
    outs: list[Any] = []
    current = carry
    mark = modes.decided_mark()
    for _ in range(4):
        with disable_proxy_modes_tracing():  # distinct example tensors: the carry owns its operands
            example = pytree.tree_map_only(torch.Tensor, torch.clone, current)
        ops = Operands(example, invariants, carried=1)
        try:
            body = trace(body_fn, ops, site)
        except DyclError:
            raise
        except Exception as exc:
            if raised_by_us(exc):
                raise  # our bug, not the body failing on tensors
            raise DyclError(f"{site.construct}: its body fails when its variables are tensors: "
                            f"{type(exc).__name__}: {exc}", location=site.location,
                            fix="keep values the loop changes usable as tensors (e.g. no list indexing with "
                            "a loop counter), or make the loop condition a Python value") from exc
        inner = modes.decided_since(mark)
        outs.append(body.values)
        plan = plans.build(site, [carry, *outs], "all", constants=False, merge=False)
        settled = plan.kinds() == plans.kinds(current)
        if settled:
            break
        with disable_proxy_modes_tracing():  # example inputs for the next trace only
            current = plan.normalize(carry)
    else:
        raise DyclError(f"{site.construct}: its variables keep changing type from one iteration to the next",
                        location=site.location, fix="give every loop variable a tensor value before the loop")
    # the test that ends the loop: its own, or (`while True`) the first tensor test in its body
    cause = next(iter(inner), site) if site.code.strip().startswith("while True") else site
    modes.note_promoted(cause, tuple(n for n, v, var in zip(site.names, carry, plan.vars)
                                    if isinstance(v, (int, float, bool))
                                    and var.spec is not None and any(not leaf.const for leaf in var.leaves)))
    init = plan.flatten(carry, clone=False)
    if not init:
        raise DyclError(f"{site.construct}: the condition is a tensor but the loop changes no tensor",
                        location=site.location, fix="make the loop condition a Python value")
    pure = _pure(site, body.writes, dict(zip(site.names, carry)))
    if pure:
        # its own copies of the carries: torch.while_loop refuses a carry that shares memory with
        # an operand it also reads (`h` carried, `w = h.t()` read), and wants each carry's strides
        # equal to the body's result's (a view carried unchanged keeps its own)
        init = [t.clone(memory_format=torch.contiguous_format) for t in init]
    elif not all(t.is_contiguous() for t in init):
        raise _views_refused(site, "one of its variables is a view of another tensor's memory")
    n = len(init)
    final = Operands(plan.rebuild(init), invariants, carried=1)
    if len(final.tensors) != n + len(Operands((), invariants, carried=1).tensors):
        # a carried tensor that is also an invariant or model state: give the loop its own copy
        init = [t.clone() for t in init]
        final = Operands(plan.rebuild(init), invariants, carried=1)

    names.record(site.label, plan.tensor_names(site))
    test_gm = trace(lambda *a: (as_pred(test_fn(*a)),), ops, site)
    # state the body updates (train-mode BatchNorm statistics) is carried too: each iteration
    # reads the value the previous one wrote, and the last one's is written after the loop
    written = body.writes
    _refuse_eval_writes(site, final, written)
    slot_ops = [final.index[s] for s in written]
    w = len(written)
    keep = [j for j in _used([test_gm, body], n) if n + j not in slot_ops]  # invariants and state the loop reads

    def full(o: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        ops_ = [*o[:n], *_expand(final.tensors[n:], keep, o[n + w:])]
        for i, value in zip(slot_ops, o[n:n + w]):
            ops_[i] = value
        return tuple(ops_)

    def test(*o: torch.Tensor) -> torch.Tensor:
        return test_gm.replay(full(o))[0].clone()

    def step(*o: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values, writes = body.replay_all(full(o))
        return (*(t.contiguous() for t in plan.flatten(tuple(values))), *(writes[s] for s in written))

    extra = [final.tensors[n + j] for j in keep]
    if pure:
        extra = _apart(extra)
    elif _sharing([*init, *extra]):
        raise _views_refused(site, "two of the tensors it reads share memory")
    # the loop's own copies: a carry may not be an operand it also reads
    state = [final.tensors[i].clone() for i in slot_ops]
    outs = list(while_loop_op(test, step, (*init, *state), tuple(extra)))
    for s, value in zip(written, outs[n:]):
        state_writes.write(*final.slots[s], value)
    return plan, outs[:n]


def _describe(run: Callable, t: Traced, plan: plans.Plan, keep: list[int], skip: int) -> None:
    """Give a branch that replays `t` the data its trace is a function of (capture/branch_traces.py
    shares one trace between branches of equal structure, adding the graph's fingerprint):
    where each of the graph's inputs comes from among the branch's operands, and what the plan
    makes of its outputs."""
    tensors = [v for v in t.flat if isinstance(v, torch.Tensor)]
    flattened = plan.flatten_key(t.values, tensors)
    if any(step == ("tensor", -1) for step in flattened):
        return
    where = {i: skip + k for k, i in enumerate(keep)}
    structure = ("replay", len(keep) + skip, tuple(where.get(i) for i in t.inputs), flattened)
    run.__dict__[_STRUCTURE] = (structure, t.gm)


_STRUCTURE = "_dycl_branch_structure"


def branch_structure(fn: Any) -> tuple[tuple, torch.fx.GraphModule] | None:
    """(structure key, source graph) of a branch `choice` made, or None (any other callable)."""
    return getattr(fn, "__dict__", {}).get(_STRUCTURE) if callable(fn) else None


def _used(traced: list[Traced], start: int) -> list[int]:
    """Indices (from `start`, counted from there) of operands some graph actually reads."""
    used: set[int] = set()
    for t in traced:
        placeholders = [node for node in t.gm.graph.nodes if node.op == "placeholder"]
        used |= {i - start for i, node in zip(t.inputs, placeholders) if i >= start and node.users}
    return sorted(used)


def _expand(defaults: list[torch.Tensor], keep: list[int], ops: tuple[torch.Tensor, ...]) -> tuple:
    """Every operand a traced graph takes: the kept ones from `ops`; the others are never read,
    so any value does (the outer tensors, which leave no trace in the branch graph)."""
    full = list(defaults)
    for k, i in enumerate(keep):
        full[i] = ops[k]
    return tuple(full)

