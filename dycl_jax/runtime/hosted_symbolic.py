"""Symbolic dimensions for an exported dispatch region: the signatures of one part that differ
only in array sizes are captured again with those dimensions dynamic (`Dim.AUTO`), lowered and
exported once with `jax.export` symbols, and checked against every signature it replaces."""
from __future__ import annotations

import functools
from typing import Any, Callable, Iterator

import jax
import numpy as np
import torch
from jax import export as jax_export

from dycl_jax.host import values
from dycl_jax.errors import raised_by_us
from dycl_jax.host.dispatch import Compiled, DispatchHost, Part
from dycl_jax.lower.int_ranges import int_scope
from dycl_jax.lower.interpreter import LoweredGraph
from dycl_jax.rewrite.modes import exclusive
from dycl_jax.runtime.artifact import _export


def _signatures(part: Part) -> Iterator[tuple[tuple, Compiled]]:
    """(signature key, program) of each compiled signature: a program over symbolic ints once
    per full signature it served (each with its ints' values)."""
    for key, entry in part.cache.items():
        if not isinstance(key[0], str):  # (a treedef compares unequal to nothing by `!=`)
            yield key, entry
        elif isinstance(entry, Compiled):  # ("variant", id)
            for served in part.served.get(id(entry), ()):
                yield served, entry


def groups(part: Part) -> list[list[tuple[Any, tuple, Compiled]]]:
    """The part's compiled signatures, grouped where only array sizes (and the values of ints
    taken as symbols) differ and the outputs' form is the same; groups of one are left out."""
    out: dict[Any, list] = {}
    for key, entry in _signatures(part):
        tree, leaves, grad, same = key
        if not isinstance(entry, Compiled) or not grad or same:  # names of one tensor: its own program
            continue
        shape_free = tuple((len(k[0]), k[1]) if _is_array(k) else "int" if i in entry.symbolic else k
                           for i, k in enumerate(leaves))
        form = (tree, shape_free, str(entry.out_tree), tuple(entry.slots), repr(entry.constants), entry.x64,
                tuple(entry.passed or ()), tuple(entry.tensor_leaves), tuple(entry.symbolic))
        out.setdefault(form, []).append((tree, leaves, entry))
    return [g for g in out.values() if len(g) > 1 and (not g[0][2].symbolic or len({_sizes(l) for _, l, _ in g}) > 1)]


def varying_inputs(host: Any, program: Any) -> set[tuple[str, str]]:
    """(host function, variable) of every region input whose array sizes differed between the
    signatures the host ran (a decode loop's growing `ys`, even within one call): a part that
    ran at only one size of such a variable may meet another size after export."""
    sizes: dict[tuple[str, str], set] = {}
    for rid, spec in enumerate(program.regions):
        st = host.regions.get(id(spec))
        for part in st.parts if st is not None else ():
            keys = [k for k in part.cache if not isinstance(k[0], str)] + [k for ks in part.served.values() for k in ks]
            for tree, leaves, *_ in keys:
                vals, _ = jax.tree_util.tree_unflatten(tree, list(range(len(leaves))))
                for name, v in zip(part.ins, vals):
                    shapes = tuple(leaves[i][0] for i in jax.tree_util.tree_leaves(v) if _is_array(leaves[i]))
                    sizes.setdefault((program.region_fn[rid], name), set()).add(shapes)
    return {n for n, s in sizes.items() if len(s) > 1}


def _is_array(k: Any) -> bool:
    return isinstance(k, tuple) and len(k) == 2 and isinstance(k[0], tuple)


def _sizes(leaves: tuple) -> tuple:
    return tuple(k[0] for k in leaves if _is_array(k))


def _varying(group: list) -> dict[int, list[int]]:
    """Per leaf index: the dimensions whose size differs between the group's signatures."""
    first = group[0][1]
    dims: dict[int, list[int]] = {}
    for i, k in enumerate(first):
        if isinstance(k, tuple) and len(k) == 2 and isinstance(k[0], tuple):
            ds = [d for d in range(len(k[0])) if len({g[1][i][0][d] for g in group}) > 1]
            if ds:
                dims[i] = ds
    return dims


def symbolic_program(host: DispatchHost, spec: Any, part: Part, fns: list[Callable], group: list,
                     example: Callable[[Any], Any], state: list) -> tuple[Any, Any, dict, list, Any] | str:
    """(plain export, traced fn over (state, tensors), {symbol: [min, max]}, per tensor input its
    shape with symbols, sources) for the group, or why not."""
    varying = _varying(group)
    # the largest signature as the example: torch specialises a dimension of size 0 or 1
    tree, leaves, entry = max(group, key=lambda g: sum(int(np.prod(k[0])) for k in g[1]
                                                         if isinstance(k, tuple) and isinstance(k[0], tuple)))
    values = [example(k) for k in leaves]
    ints = frozenset(entry.symbolic)  # Python ints the programs take as symbols: symbols here too
    index = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor) or i in ints]
    if index != entry.tensor_leaves:
        return "its tensor inputs differ from the compiled program's"
    dynamic = [varying.get(i, []) for i in index if i not in ints]
    args = tuple(jax.tree_util.tree_unflatten(tree, values))
    try:
        cap = _capture(host, spec, part, fns, args, dynamic, ints)
    except Exception as exc:  # noqa: BLE001 - torch.export refused the dynamic sizes: per signature instead
        if raised_by_us(exc):
            raise  # our own bug: it must surface, not become a per-signature fallback
        return f"torch.export with dynamic sizes: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    made = export_captured(host, spec, cap, entry, state, [leaves[i][1] for i in index], ints)
    if isinstance(made, str):
        return made
    plain, run, graph, ranges, shapes, sources, state_avals, sym_avals = made
    scalar = jax.ShapeDtypeStruct((), np.int64 if entry.x64 else np.int32, weak_type=True)
    with int_scope(entry.x64):
        for t2, l2, e2 in group:  # every signature it replaces gives the same output shapes
            concrete = [scalar if i in ints else jax.ShapeDtypeStruct(tuple(l2[i][0]), l2[i][1]) for i in index]
            if not fits(shapes, l2, index, ranges):
                continue
            want = jax.eval_shape(getattr(e2.fn, "__wrapped__", e2.fn), state_avals_of(e2, state), concrete)
            got = jax.eval_shape(plain.call, state_avals, concrete)
            if [a.shape for a in jax.tree_util.tree_leaves(want)] != [a.shape for a in jax.tree_util.tree_leaves(got)]:
                return "the symbolic program gives other output shapes than a compiled signature"
    traced = functools.partial(run, call=graph.with_margins) if entry.margins is not None else None
    return plain, (traced, state_avals, sym_avals), ranges, shapes, sources, cap.ints


def export_captured(host: DispatchHost, spec: Any, cap: Any, entry: Compiled, state: list, dtypes: list,
                    ints: frozenset[int] = frozenset(), static_ok: bool = False) -> tuple | str:
    """A capture with dynamic sizes (and symbolic ints `ints`, by leaf) exported with jax symbols:
    (plain export, run, lowered graph, {symbol: [min, max]}, per input its shape with symbols (None:
    an int), sources, state avals, input avals), or why not. Its outputs must have `entry`'s form."""
    if (cap.slots, str(cap.out_tree), cap.passed) != (entry.slots, str(entry.out_tree), entry.passed or
                                                      [None] * len(entry.slots)):
        return "the dynamic capture returns another output form"
    if ints and (cap.ints is None or cap.ints.static or tuple(cap.ints.leaves) != tuple(entry.symbolic)):
        return "with symbolic sizes, its Python ints must be values (a size or a guard reads them)"
    gm = cap.ep.graph_module
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    n_state = len(cap.state)
    shapes: list[list | None] = []  # None: a symbolic int
    names: list[str] = []
    for i, node in zip(cap.inputs, placeholders[n_state:]):
        if i in ints:
            shapes.append(None)
            continue
        shape = []
        for d in node.meta["val"].shape:
            if isinstance(d, torch.SymInt):
                text = str(d)
                if not text.isidentifier():
                    return f"a dimension is the expression {text}"
                names += [text] if text not in names else []
                shape.append(text)
            else:
                shape.append(int(d))
        shapes.append(shape)
    if not names and not static_ok:
        return "torch.export specialised every varying dimension"
    ranges = {}
    for sym, vr in cap.ep.range_constraints.items():
        if str(sym) in names:
            hi = None if str(vr.upper).endswith("oo") else int(vr.upper)  # int_oo: unbounded
            ranges[str(sym)] = [int(vr.lower), hi]
    with int_scope(entry.x64):
        run, graph, sources, state_avals = lowered(host, spec, cap, state)
        # torch's range of each symbol as constraints, so JAX can decide what torch's guards
        # decided (`pe[:n]` on a 32-row buffer is n rows when n <= 32)
        bounds = [f"{n} >= {lo}" for n, (lo, _) in ranges.items() if lo > 1] + \
                 [f"{n} <= {hi}" for n, (_, hi) in ranges.items() if hi is not None]
        dims = dict(zip(names, jax_export.symbolic_shape(",".join(names), constraints=bounds))) if names else {}
        scalar = jax.ShapeDtypeStruct((), np.int64 if entry.x64 else np.int32, weak_type=True)
        sym_avals = [scalar if shape is None else
                     jax.ShapeDtypeStruct(tuple(dims[d] if isinstance(d, str) else d for d in shape), dt)
                     for shape, dt in zip(shapes, dtypes)]
        try:
            plain = _export(run, state_avals, sym_avals)
        except Exception as exc:  # noqa: BLE001 - the lowering needs static sizes somewhere: per signature instead
            if raised_by_us(exc):
                raise  # our own bug: it must surface, not become a per-signature fallback
            return f"jax.export with symbolic sizes: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
    return plain, run, graph, ranges, shapes, sources, state_avals, sym_avals


def lowered(host: DispatchHost, spec: Any, cap: Any, state: list) -> tuple[Callable, Any, list, list]:
    """A captured region as `run(state inputs, tensors)` (as the dispatch host builds it), its
    lowered graph, its state sources and their avals."""
    gm = cap.ep.graph_module
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    n_state = len(cap.state)
    used = [i for i in range(n_state) if placeholders[i].users]
    graph = LoweredGraph.build(gm, name=spec.label)

    def run(s: list, t: list, call: Callable = graph) -> tuple:
        full: list[Any] = [None] * n_state
        for i, v in zip(used, s):
            full[i] = v
        return call(*full, *t)

    sources = [(True, host.path_index[e.path]) if e.kind != "constant" and e.path in host.path_index
               else (False, values.to_jax(e.tensor)) for e in (cap.state[i] for i in used)]
    state_avals = [jax.ShapeDtypeStruct(np.shape(state[v] if is_state else v), (state[v] if is_state else v).dtype)
                   for is_state, v in sources]
    return run, graph, sources, state_avals


def small_sizes(host: DispatchHost, spec: Any, part: Part, fns: list, group: list, example: Callable,
                state: list, shapes: list, ranges: dict) -> list[tuple]:
    """Signatures at sizes 1 and 0 of a group's only symbol (torch specialises those, so the
    symbolic program starts at 2), captured with static shapes: (leaves, plain export, traced
    fn, state avals, tensor avals, sources) for each that captures with the group's output form."""
    if len(ranges) != 1 or None in shapes:  # (with symbolic ints: the programs of the signatures run)
        return []
    (sym, (lo, _)), = ranges.items()
    tree, leaves, entry = group[0]
    out = []
    for size in range(min(lo, 2)):
        keys = list(leaves)
        for shape, i in zip(shapes, entry.tensor_leaves):
            keys[i] = (tuple(size if d == sym else d for d in shape), leaves[i][1])
        if any(tuple(k) == tuple(keys) for _, k, _ in group):
            continue  # compiled already
        vals = [example(k) for k in keys]
        try:
            cap = _capture(host, spec, part, fns, tuple(jax.tree_util.tree_unflatten(tree, vals)), None)
            if (cap.slots, str(cap.out_tree)) != (entry.slots, str(entry.out_tree)):
                continue
            with int_scope(entry.x64):
                run, graph, sources, state_avals = lowered(host, spec, cap, state)
                tensors = [jax.ShapeDtypeStruct(tuple(keys[i][0]), keys[i][1]) for i in entry.tensor_leaves]
                plain = _export(run, state_avals, tensors)
        except Exception as exc:  # noqa: BLE001 - a size the statements cannot take (e.g. an empty reduction): not served
            if raised_by_us(exc):
                raise  # our own bug: it must surface, not become a per-signature fallback
            continue
        traced = functools.partial(run, call=graph.with_margins) if entry.margins is not None else None
        out.append((tuple(keys), plain, traced, state_avals, tensors, sources))
    return out


def state_avals_of(entry: Compiled, state: list) -> list:
    return [jax.ShapeDtypeStruct(np.shape(state[v] if s else v), (state[v] if s else v).dtype)
            for s, v in entry.sources]


def takes(group: list, shapes: list, ranges: dict, key: tuple) -> bool:
    """Whether the program with symbolic sizes made for `group` serves signature `key`: the
    group's form, sizes in its ranges, and its ints (by value) within a guard of the group."""
    tree, leaves, grad, same = key
    tree0, leaves0, entry = group[0]
    if tree != tree0 or not grad or same or len(leaves) != len(leaves0):
        return False
    for i, (k, k0) in enumerate(zip(leaves, leaves0)):
        if _is_array(k) != _is_array(k0):
            return False
        if _is_array(k):
            if k[1] != k0[1] or len(k[0]) != len(k0[0]):
                return False
        elif i in entry.symbolic:
            if k[0] is not int:
                return False
        elif k != k0:
            return False
    if not fits(shapes, leaves, entry.tensor_leaves, ranges):
        return False
    probe = [k[1] if i in entry.symbolic else None for i, k in enumerate(leaves)]
    return any(e.guard is None or e.guard(probe) for _, _, e in group)


def fits(shapes: list, leaves: tuple, index: list[int], ranges: dict) -> bool:
    """Whether a signature's array sizes are ones the symbolic program takes."""
    bound: dict[str, int] = {}
    for shape, i in zip(shapes, index):
        if shape is None:  # a symbolic int (its guard is checked apart)
            if leaves[i][0] is not int:
                return False
            continue
        size = leaves[i][0]
        if len(size) != len(shape):
            return False
        for want, got in zip(shape, size):
            if isinstance(want, str):
                lo, hi = ranges.get(want, [0, None])
                if bound.setdefault(want, got) != got or got < lo or (hi is not None and got > hi):
                    return False
            elif want != got:
                return False
    return True


@exclusive  # torch.export runs under the rewrite's process-wide modes
def _capture(host: DispatchHost, spec: Any, part: Part, fns: list, args: tuple, dynamic: list,
             ints: frozenset[int] = frozenset()) -> Any:
    from dycl_jax.capture.region import capture_call
    return capture_call(host.root, host._body(spec, part, fns), args, host._capture_context, frozenset(),
                        dynamic=ints, dims=dynamic)
