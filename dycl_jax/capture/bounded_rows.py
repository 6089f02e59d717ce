"""The proof that a bounded row selection (rewrite/rows.py) equals the original: on the captured
ATen graph, every op between a `dycl::rows_in` marker and its `dycl::rows_out` marker is row-wise
in the marked dimension (row i of its result depends only on row i of its marked inputs), and no
marked value goes anywhere else. Then computing on all rows and keeping the selected ones gives
the selected rows' values, so the markers are removed; otherwise the capture is refused (the
dispatch host runs the selection with its exact row count): never a wrong answer.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from dycl_jax.errors import CaptureError, Location
from dycl_jax.rewrite import rows as rows_rt

aten = torch.ops.aten
_IN = torch.ops.dycl.rows_in.default
_OUT = torch.ops.dycl.rows_out.default

# pointwise ops: each output element is a function of the same-position (broadcast) input elements
_POINTWISE = {getattr(aten, n) for n in (
    "add", "sub", "rsub", "mul", "div", "neg", "abs", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10",
    "sqrt", "rsqrt", "reciprocal", "pow", "sin", "cos", "tan", "tanh", "sinh", "cosh", "asin", "acos", "atan",
    "atan2", "sigmoid", "relu", "gelu", "silu", "elu", "leaky_relu", "hardtanh", "hardsigmoid", "hardswish",
    "mish", "softplus", "erf", "erfc", "sign", "floor", "ceil", "round", "trunc", "frac", "clamp", "clamp_min",
    "clamp_max", "where", "maximum", "minimum", "fmod", "remainder", "eq", "ne", "lt", "le", "gt", "ge",
    "logical_and", "logical_or", "logical_not", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_not",
    "bitwise_xor", "isnan", "isinf", "isfinite", "_to_copy", "clone", "alias", "detach", "masked_fill",
    "lerp", "square", "threshold", "nan_to_num", "copy", "fill", "zeros_like", "ones_like", "full_like")
    if hasattr(aten, n)}
# reductions and normalisations over some dimensions, row-wise when the row dimension is not one of them
_REDUCE = {aten.sum, aten.mean, aten.amax, aten.amin, aten.prod, aten.var, aten.std, aten.argmax, aten.argmin,
           aten.max, aten.min, aten.any, aten.all, aten.logsumexp, aten.norm, aten.linalg_vector_norm, aten.var_mean}


class OverBudget(CaptureError):
    """The dense form is proved but over the contraction budget `prove` was given."""


class _Unproven(Exception):
    """An op the proof cannot show row-wise."""


def _packet(target: Any) -> Any:
    return getattr(target, "overloadpacket", None)


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _same(a: Any, b: Any) -> bool:
    return statically_known_true(a == b)


def _shape(node: Any) -> tuple:
    v = _val(node)
    if not isinstance(v, torch.Tensor):
        raise _Unproven(f"{node} has no tensor value")
    return tuple(v.shape)


def _dims(spec: Any, ndim: int) -> list[int] | None:
    if spec is None:
        return None
    spec = [spec] if isinstance(spec, int) else list(spec)
    return [d % ndim if ndim else 0 for d in spec] if spec else None


def _pointwise(node: Any, marked: dict) -> int:
    """The output's row dimension: each marked input's row dimension, right-aligned, must agree;
    an unmarked input must not extend along it (it would be sized for the selected rows)."""
    out = _shape(node)
    rows = set()
    for a in _tensor_args(node):
        shape = _shape(a)
        lead = len(out) - len(shape)
        if a in marked:
            r = marked[a] + lead
            if not _same(shape[marked[a]], out[r]):
                raise _Unproven(f"{node.target} broadcasts the rows")
            rows.add(r)
    if len(rows) != 1:
        raise _Unproven(f"{node.target} mixes rows of different dimensions")
    r = rows.pop()
    for a in _tensor_args(node):
        shape = _shape(a)
        k = r - (len(out) - len(shape))
        if a not in marked and 0 <= k < len(shape) and not _same(shape[k], 1):
            raise _Unproven(f"{node.target} reads a tensor along the rows that is not indexed by the selection")
    return r


def _tensor_args(node: Any) -> list:
    flat = [*node.args, *node.kwargs.values()]
    out = []
    for a in flat:
        for x in (a if isinstance(a, (list, tuple)) else [a]):
            if isinstance(x, torch.fx.Node) and isinstance(_val(x), torch.Tensor):
                out.append(x)
    return out


def _view(node: Any, r: int) -> int:
    """A reshape keeps the rows where the sizes up to and including the row dimension stay."""
    src, dst = _shape(node.args[0]), _shape(node)
    if len(dst) > r and all(_same(a, b) for a, b in zip(src[:r + 1], dst[:r + 1])):
        return r
    raise _Unproven("a reshape moves the rows")


def _rule(node: Any, marked: dict) -> Any:
    """The row dimension of `node`'s result (an int, or a tuple per output), or _Unproven."""
    t, p = node.target, _packet(node.target)
    ins = [a for a in _tensor_args(node) if a in marked]
    x = node.args[0] if node.args else None
    r = marked.get(x) if isinstance(x, torch.fx.Node) else None
    if t is operator.getitem:
        rows = marked[x]
        if not isinstance(rows, tuple) or rows[node.args[1]] is None:
            raise _Unproven("an unmarked part of a result")
        return rows[node.args[1]]
    if p in _POINTWISE:
        return _pointwise(node, marked)
    if p in (aten.mm, aten.addmm):
        a, b = (node.args[1], node.args[2]) if p is aten.addmm else (node.args[0], node.args[1])
        if b in marked or marked.get(a) != 0 or (p is aten.addmm and node.args[0] in marked):
            raise _Unproven(f"{p} mixes rows")
        if p is aten.addmm and len(_shape(node.args[0])) == 2 and not _same(_shape(node.args[0])[0], 1):
            raise _Unproven("addmm adds a tensor along the rows")
        return 0
    if t in (aten.convolution.default,):
        if ins != [x] or r != 0:
            raise _Unproven("a convolution of marked weights or over the rows")
        return 0
    if p is aten.embedding:
        if ins != [node.args[1]]:
            raise _Unproven("an embedding of marked weights")
        return marked[node.args[1]]
    if ins != [x]:
        raise _Unproven(f"{t} reads marked rows through more than its first argument")
    nd = len(_shape(x))
    if p in (aten.view, aten.reshape, aten._unsafe_view):
        return _view(node, r)
    if p is aten.permute:
        return [d % nd for d in node.args[1]].index(r)
    if p in (aten.t, aten.transpose):
        d0, d1 = (0, 1) if p is aten.t else (node.args[1] % nd, node.args[2] % nd)
        return d1 if r == d0 else d0 if r == d1 else r
    if p is aten.unsqueeze:
        d = node.args[1] % (nd + 1)
        return r + 1 if d <= r else r
    if p is aten.squeeze:
        dims = _dims(node.args[1] if len(node.args) > 1 else None, nd)
        dims = [d for d in range(nd) if _same(_shape(x)[d], 1)] if dims is None else dims
        if r in dims:
            raise _Unproven("a squeeze of the rows")
        return r - sum(1 for d in dims if d < r)
    if p is aten.expand:
        out = _shape(node)
        lead = len(out) - nd
        if not _same(_shape(x)[r], out[r + lead]):
            raise _Unproven("an expand of the rows")
        return r + lead
    if p in (aten.slice, aten.select, aten.narrow):
        d = (node.args[1] if len(node.args) > 1 else 0) % nd
        if d == r:
            raise _Unproven(f"{p} along the rows")
        return r - 1 if p is aten.select and d < r else r
    if p in (aten._softmax, aten._log_softmax):
        if node.args[1] % nd == r:
            raise _Unproven("a softmax over the rows")
        return r
    if p is aten.native_layer_norm:
        if r >= nd - len(node.args[1]) or any(a in marked for a in node.args[2:4]):
            raise _Unproven("a layer norm over the rows")
        return (r, r, r)
    if t is aten._native_batch_norm_legit_no_training.default:
        if r != 0 or any(a in marked for a in node.args[1:5]):
            raise _Unproven("a batch norm with marked statistics")
        return (0, None, None)
    if p in _REDUCE:
        dims = _dims(node.args[1] if len(node.args) > 1 else node.kwargs.get("dim"), nd)
        if dims is None or r in dims:
            raise _Unproven(f"{p} reduces over the rows")
        keep = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        r2 = r if keep else r - sum(1 for d in dims if d < r)
        return (r2, r2) if isinstance(_val(node), (tuple, list)) else r2
    raise _Unproven(f"{t} is not known to be row-wise")


def prove(gm: torch.fx.GraphModule, budget: float | None = None) -> list[Location]:
    """Check every bounded selection in `gm` and in its branch and loop bodies, then remove the
    markers; CaptureError where a selection's computation is not provably row-wise, or where its
    contractions over all rows take more than `budget` floating-point operations (the dispatch
    host's choice: past it, the exact row count is cheaper than the dense form). Each graph
    is checked alone: a marked value that enters or leaves one (a cond's operand or result) is
    refused where it meets the cond or the graph's output. Returns where the proved selections
    were written (once per statement, in source order), for the report."""
    uids: set[int] = set()
    total = 0.0
    for sub in [m for m in gm.modules() if isinstance(m, torch.fx.GraphModule)]:
        found, work = _prove_graph(sub)
        uids |= found
        total += work
    if budget is not None and total > budget:
        raise OverBudget(
            f"the row selection computed densely over all rows would take {total / 1e6:.1f} MFLOP of contractions, "
            f"more than the {budget / 1e6:.0f} MFLOP budget of the dense form: the selection runs with its exact "
            "row count", location=rows_rt.location(min(uids)) if uids else None)
    found_at = {(loc.file, loc.line): loc for u in uids if (loc := rows_rt.location(u)) is not None}
    return [found_at[k] for k in sorted(found_at)]


def _contraction_flops(node: Any) -> float:
    """Multiply-adds (x2) of a matrix product or convolution over the marked rows: the work
    the dense form repeats for the rows the selection leaves out."""
    p = _packet(node.target)
    out = _shape(node)
    if p in (aten.mm, aten.addmm, aten.bmm):
        a = node.args[1] if p is aten.addmm else node.args[0]
        return 2.0 * _numel(out) * _hint(_shape(a)[-1])
    if node.target is aten.convolution.default:
        w = _shape(node.args[1])
        return 2.0 * _numel(out) * _numel(w[1:])
    return 0.0


def _hint(d: Any) -> float:
    """A size as a number: a symbolic size by its example value (an estimate is all it is for)."""
    if isinstance(d, int):
        return float(d)
    hint = getattr(getattr(d, "node", None), "hint", None)
    return float(hint) if hint is not None else 1.0


def _numel(shape: Any) -> float:
    n = 1.0
    for d in shape:
        n *= _hint(d)
    return n


def _prove_graph(gm: torch.fx.GraphModule) -> tuple[set[int], float]:
    """The uids of the selections proved in `gm` (markers removed) and the contraction work on their rows."""
    graph = gm.graph
    markers = [n for n in graph.nodes if n.op == "call_function" and n.target in (_IN, _OUT)]
    if not markers:
        return set(), 0.0
    work = 0.0
    marked: dict = {}  # node -> row dimension of its marked value (tuple for multi-output ops)
    group: dict = {}  # node -> the uid of the selection its marked rows belong to
    for node in graph.nodes:
        if node.op != "call_function":
            if node.op == "output" and any(a in marked for a in _flat_nodes(node.args)):
                _refuse(node, group, "a value computed from the selected rows is returned as it is")
            continue
        reads = [a for a in _flat_nodes((node.args, node.kwargs)) if a in marked]
        uids = {group[a] for a in reads}
        if node.target is _IN:
            if reads:
                _refuse(node, group, "a selection's rows index another selection")
            marked[node], group[node] = 0, node.args[1]
            continue
        if not reads:
            if node.target is _OUT and _shape(node.args[0]) and not _same(_shape(node.args[0])[0], 1):
                # a value not computed from the selected rows that is sized for the mask's rows
                # (the original would need exactly that many selected rows)
                _refuse(node, group, "the written value has the mask's rows without being computed from them",
                        node.args[1])
            continue
        if len(uids) > 1:
            _refuse(node, group, "rows of two selections meet")
        uid = uids.pop()
        if node.target is _OUT:
            if node.args[1] != uid or marked.get(node.args[0]) != 0:
                _refuse(node, group, "the written value does not keep the rows in its first dimension", uid)
            continue
        if node.target is aten._assert_tensor_metadata.default:
            continue  # a dtype check, no value
        if node.target is aten.sym_size.int:
            if node.args[1] == marked[node.args[0]]:
                _refuse(node, group, "the number of selected rows is read", uid)
            continue
        try:
            marked[node], group[node] = _rule(node, marked), uid
            work += _contraction_flops(node)
        except _Unproven as why:
            _refuse(node, group, str(why), uid)
    for node in markers:
        node.replace_all_uses_with(node.args[0])
        graph.erase_node(node)
    gm.recompile()
    return {n.args[1] for n in markers}, work


def _flat_nodes(args: Any) -> list:
    out: list = []
    torch.fx.node.map_arg(args, out.append)
    return out


def _refuse(node: Any, group: dict, why: str, uid: int | None = None) -> None:
    uid = uid if uid is not None else next((group[a] for a in _flat_nodes(node.args) if a in group), None)
    # (from None: the refusal says why; our own _Unproven signal behind it is not its cause)
    raise CaptureError(
        f"the row selection cannot run as a masked computation over all rows, as it is not proved row-wise: {why}",
        location=rows_rt.location(uid) if uid is not None else None,
        fix='convert with host="auto" (the default) or host="dispatch": that host runs the selection with its '
            "exact row count") from None
