"""torch.cond's per-call branch analyses, done once per distinct branch structure while capturing.

Each torch.cond torch traces (once by torch.export, once more by run_decompositions) derives
its schema (`gen_schema`, twice where parameters require grad) and checks each branch for
input mutation and aliasing, every time by tracing both branches again: for a ResNet-110 with
54 gated blocks, about 40% of the capture. Both results are functions of the branch graphs'
structure (ops, arguments, shapes, dtypes: `fingerprint.py`) and of the operands' metadata,
not of which parameters the branch reads, so structurally equal branch graphs on operands of
equal metadata share them. Only branches that are fx graphs are keyed (a Python callable has
no structure to compare; torch.export has traced the branch callables of rewrite/staged.py to
graphs before it checks them) and only a check that passed is remembered: a failing one raises
again, as torch decides, for every cond.
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Any, Callable, Iterator

import torch
from torch._higher_order_ops.cond import CondOp

from dycl_jax.capture.fingerprint import graph_fingerprint

# the package re-exports functions under its modules' names (`cond`), so the module by path
hop_utils = importlib.import_module("torch._higher_order_ops.utils")


def _meta(v: Any) -> Any:
    """What torch's analyses see of an operand: layout for a tensor, the value of anything else."""
    if isinstance(v, torch.fx.Proxy):
        v = v.node
    if isinstance(v, torch.fx.Node):
        v = v.meta.get("example_value", v.meta.get("val"))
    if isinstance(v, torch.Tensor):
        return ("T", tuple(str(d) for d in v.shape), tuple(str(s) for s in v.stride()), str(v.dtype),
                str(v.device), v.requires_grad)
    if isinstance(v, (int, float, bool, str, type(None))):
        return (type(v).__name__, v)
    return None  # e.g. a SymInt: no key


def _plain_graph(f: Any) -> bool:
    # a call_module node is fingerprinted by the submodule's name, not by what it computes
    return isinstance(f, torch.fx.GraphModule) and not any(
        n.op == "call_module" for m in f.modules() if isinstance(m, torch.fx.GraphModule) for n in m.graph.nodes)


def _key(fns: tuple, values: tuple, *extra: Any) -> tuple | None:
    if not all(_plain_graph(f) for f in fns):
        return None
    metas = tuple(_meta(v) for v in values)
    if any(m is None for m in metas):
        return None
    return (*(graph_fingerprint(f) for f in fns), metas, *extra)


@contextlib.contextmanager
def shared_branch_checks() -> Iterator[dict]:
    """While active, torch.cond's schema and alias/mutation checks are computed once per key;
    yields the memo (for tests: how many distinct keys were computed)."""
    memo: dict[tuple, Any] = {}
    gen_schema = CondOp.gen_schema
    check = hop_utils._check_alias_and_mutation

    def shared_schema(self: Any, pred: Any, true_fn: Callable, false_fn: Callable, operands: Any) -> Any:
        key = _key((true_fn, false_fn), (pred, *operands), "schema")
        if key is None:
            return gen_schema(self, pred, true_fn, false_fn, operands)
        if key not in memo:
            memo[key] = gen_schema(self, pred, true_fn, false_fn, operands)
        return memo[key]

    def shared_check(graph_module: Any, inputs_fake: Any, name: str, pre_dispatch: bool) -> None:
        key = _key((graph_module,), tuple(inputs_fake), "alias", name, pre_dispatch)
        if key is None or key not in memo:
            check(graph_module, inputs_fake, name, pre_dispatch)  # raises where the branch aliases or mutates
            if key is not None:
                memo[key] = True

    CondOp.gen_schema = shared_schema  # type: ignore[method-assign]
    hop_utils._check_alias_and_mutation = shared_check
    try:
        yield memo
    finally:
        CondOp.gen_schema = gen_schema  # type: ignore[method-assign]
        hop_utils._check_alias_and_mutation = check
