"""torch.cond's branch traces, done once per distinct branch structure while capturing.

torch traces both branches of every cond to a sub-graph (`trace_cond`, once in torch.export and
once more in run_decompositions) and runs the two sub-graphs again under the fake mode for the
cond's output metadata. For a ResNet-110 BlockDrop that is 54 traces of each of a few distinct
blocks per pass. A branch is keyed when it is a plain fx graph (no attributes, no submodule
calls; `fingerprint.py`), or a replay of one that rewrite/staged.py describes
(`staged.branch_structure`), seen through torch's own functionalize and interpreter wrappers;
the key adds the operands' layouts, the tracer (one pass; its decomposition table), grad mode
and the dispatch key sets. A later branch of an equal key gets a copy of the first one's traced
graph, with each node's module path and stack trace translated to those of its own source graph
(emit/ rebuilds module calls from them; nodes that take theirs from the tracing context get the
current context's): where that translation is not one to one, or a graph reads a tensor constant, it is
traced as torch does. Fake-mode outputs (metadata only; also in AOT's metadata pass, whose
branches are functionalized callables) are reused only when every output is a tensor whose
sizes hold no unbacked symbol. Graphs with effectful ops are never shared (effect tokens are
state of the functional mode).
"""
from __future__ import annotations

import contextlib
import importlib
import types
from typing import Any, Callable, Iterator

import torch
import torch.fx
import torch.fx.traceback as fx_traceback
import torch.utils._pytree as pytree
from torch._higher_order_ops.effects import has_effects
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx._lazy_graph_module import _make_graph_module
from torch.fx.experimental import proxy_tensor
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from dycl_jax.capture.branch_checks import _meta, _plain_graph
from dycl_jax.capture.fingerprint import graph_fingerprint
from dycl_jax.rewrite.staged import branch_structure

cond_module = importlib.import_module("torch._higher_order_ops.cond")
hop_utils = importlib.import_module("torch._higher_order_ops.utils")
functional_tensor = importlib.import_module("torch._subclasses.functional_tensor")

_FIELDS = ("nn_module_stack", "stack_trace")
_WITH_EFFECTS = torch.ops.higher_order.with_effects  # node metadata that names the block a node belongs to


def _inner_code(fn: Callable, name: str) -> types.CodeType | None:
    return next((c for c in fn.__code__.co_consts if isinstance(c, types.CodeType) and c.co_name == name), None)


# torch's wrappers around a branch: seen through by code object (None: a torch without them, no key)
_WRAPPERS = {_inner_code(functional_tensor.dispatch_functionalize, "inner"): ("functionalize", "func", "mode"),
             _inner_code(hop_utils._maybe_run_with_interpreter, "graph_with_interpreter"): ("interpreter", "fn", None)}
_WRAPPERS.pop(None, None)


def _flat(gm: Any) -> bool:
    """A plain graph with no attribute reads and no effect tokens: a copy of it computes the
    same on its own."""
    return _plain_graph(gm) and not any(n.op == "get_attr" or n.target is _WITH_EFFECTS or _effectful(n)
                                        for n in gm.graph.nodes)


def _effectful(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) and has_effects(node.target)


def _source(fn: Any) -> tuple[tuple, torch.fx.GraphModule] | None:
    """(structure key, the graph whose node metadata the trace inherits) of a branch, or None."""
    parts: list[Any] = []
    for _ in range(8):
        if isinstance(fn, torch.fx.GraphModule):
            return ((*parts, graph_fingerprint(fn)), fn) if _flat(fn) else None
        described = branch_structure(fn)
        if described is not None:
            key, graph = described
            return ((*parts, key, graph_fingerprint(graph)), graph) if _flat(graph) else None
        wrapper = _WRAPPERS.get(getattr(fn, "__code__", None))
        if wrapper is None or fn.__closure__ is None:
            return None
        label, inner, extra = wrapper
        cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__)))
        parts.append((label, _mode_key(cells.get(extra)) if extra else None))
        fn = cells.get(inner)
    return None


def _mode_key(mode: Any) -> tuple:
    # how a functional mode traces (torch makes one per cond); its effect tokens are state, so a
    # graph with effects is never shared (`_flat`)
    return (type(mode).__qualname__, *(repr(getattr(mode, a, None)) for a in ("pre_dispatch", "export",
                                                                            "_allow_token_discovery")),
            tuple(getattr(mode, "_tokens", {})))


def _meta_key(node: torch.fx.Node) -> tuple:
    return tuple(repr(node.meta.get(f)) for f in _FIELDS)


def _translated(cached: torch.fx.GraphModule, old: torch.fx.GraphModule, new: torch.fx.GraphModule,
                current: dict) -> torch.fx.GraphModule | None:
    """A copy of `cached` (traced from `old`) with node metadata as if traced from `new` in
    the context whose node metadata is `current`."""
    olds, news = list(old.graph.nodes), list(new.graph.nodes)
    if len(olds) != len(news):
        return None
    table: dict[tuple, tuple] = {}
    for a, b in zip(olds, news):
        value = tuple(b.meta.get(f) for f in _FIELDS)
        if table.setdefault(_meta_key(a), value) != value:
            return None  # one old path stands for two new ones: no one-to-one translation
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(cached.graph, {}))
    for node in graph.nodes:
        value = table.get(_meta_key(node))
        if value is None:  # from the tracing context (placeholders, plan copies), as torch gives it
            value = tuple(current.get(f, node.meta.get(f)) for f in _FIELDS)
        for f, v in zip(_FIELDS, value):
            node.meta[f] = v.copy() if isinstance(v, dict) else v
    copy = _make_graph_module(cached, graph)  # lazy while capturing (shims.py)
    copy.meta = dict(cached.meta)
    return copy


class _Same:
    """An object in a key by identity (and kept alive with the memo, so its id stays its own)."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj


def _context(tracer: Any = None) -> tuple:
    """What else a trace depends on: grad mode, dispatch key sets, whether torch copies node
    metadata from the node it interprets (`_current_meta`), and the tracer's module stack."""
    stack = getattr(getattr(tracer, "fx_tracer", None), "module_stack", None)
    return (torch.is_grad_enabled(), str(torch._C._dispatch_tls_local_include_set()),
            str(torch._C._dispatch_tls_local_exclude_set()), fx_traceback.has_preserved_node_meta(), repr(stack))


def _current_meta() -> dict:
    # the node torch is interpreting: torch copies its metadata onto nodes made meanwhile
    return fx_traceback.get_current_meta() if fx_traceback.has_preserved_node_meta() else {}


@contextlib.contextmanager
def shared_branch_traces() -> Iterator[dict]:
    """While active, equal torch.cond branches are traced once per pass; yields the memo
    (for tests: `memo["hits"]` counts the traces and fake runs that were reused)."""
    memo: dict[Any, Any] = {"hits": 0}
    reenter = cond_module.reenter_make_fx
    fake_rule = cond_module.cond_op.python_key_table[FakeTensorMode]

    def shared_reenter(fn: Callable, subgraph_decomp_table: Any = None) -> Callable:
        traced = reenter(fn, subgraph_decomp_table)
        src = _source(fn) if subgraph_decomp_table is None else None
        if src is None:
            return traced

        def wrapped(*args: Any) -> torch.fx.GraphModule:
            metas = tuple(_meta(a) for a in args)
            tracer = proxy_tensor._CURRENT_MAKE_FX_TRACER
            if any(m is None for m in metas) or tracer is None:
                return traced(*args)
            key = ("trace", src[0], metas, _Same(tracer), _context(tracer))  # the tracer object: one pass, alive
            hit = memo.get(key)
            if hit is not None:
                copy = _translated(hit[0], hit[1], src[1], _current_meta())
                if copy is not None:
                    memo["hits"] += 1
                    return copy
            gm = traced(*args)
            if hit is None and _flat(gm):
                memo[key] = (gm, src[1])
            return gm

        return wrapped

    def shared_fake(mode: FakeTensorMode, pred: Any, true_fn: Any, false_fn: Any, operands: Any) -> Any:
        metas = tuple(_meta(v) for v in (pred, *operands))
        sources = (_source(true_fn), _source(false_fn))  # graphs, or (functionalized) replays of one
        if any(s is None for s in sources) or any(m is None for m in metas):
            return fake_rule(mode, pred, true_fn, false_fn, operands)
        key = ("fake", sources[0][0], sources[1][0], metas, _Same(mode), _context())
        hit = memo.get(key)
        if hit is not None:
            memo["hits"] += 1
            layouts, spec = hit
            with mode:
                made = [torch.empty_strided(size, stride, dtype=dtype, device=device)
                        for size, stride, dtype, device in layouts]
            return pytree.tree_unflatten(made, spec)
        out = fake_rule(mode, pred, true_fn, false_fn, operands)
        flat, spec = pytree.tree_flatten(out)
        if all(isinstance(t, torch.Tensor) and not free_unbacked_symbols((*t.shape, *t.stride())) for t in flat):
            memo[key] = ([(tuple(t.shape), tuple(t.stride()), t.dtype, t.device) for t in flat], spec)
        return out

    cond_module.reenter_make_fx = shared_reenter
    cond_module.cond_op.python_key_table[FakeTensorMode] = shared_fake
    try:
        yield memo
    finally:
        cond_module.reenter_make_fx = reenter
        cond_module.cond_op.python_key_table[FakeTensorMode] = fake_rule
