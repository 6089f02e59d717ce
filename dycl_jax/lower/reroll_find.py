"""Finds runs of structurally identical gated blocks in a top-level fx graph (see lower/reroll.py).

A *segment* is the stretch of nodes that ends with a top-level `torch.cond` and its getitems.
Its *carried* nodes are the cond, its results and every node that reads a carried node of its
own or of the previous segment; the rest are *free* (they read only values from before or
the segment's own free nodes: BlockDrop's `policy[:, t]` and its test). A run is a sequence of
segments whose carried nodes are equal up to which state they read: the same ops, constants,
shapes, dtypes, strides and branch graphs, each reading the previous segment's carried values
at the same positions. Free nodes may differ in their constants (the block index `t`); only
their metadata must agree, as their values are stacked per block.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from dycl_jax.capture.fingerprint import graph_fingerprint, layout_meta

MIN_RUN = 4  # shorter runs compile quickly unrolled: rerolling them would only rename their state
_COND = torch.ops.higher_order.cond
_getitem = operator.getitem


@dataclass
class Run:
    """Segments `segments[0..n)` (node lists of equal length) that lower as one `lax.scan`."""

    segments: list[list[torch.fx.Node]]
    carried: list[int]  # positions the scan body computes, in order: carried nodes and free ones equal in every segment
    carry: list[int]  # positions whose values the next segment reads: the scan's carry
    init: dict[int, torch.fx.Node]  # carry position -> the value before the run (read by segment 0)
    xs: list[int]  # positions of the other free nodes that the body reads: stacked per segment
    gathered: set[int] = field(default_factory=set)  # of xs: `select(x, dim, t)` with only t varying (one gather)
    groups: list[tuple[torch.fx.Node, ...]] = field(default_factory=list)  # state placeholders stacked, per segment

    @property
    def nodes(self) -> set[torch.fx.Node]:
        return {n for seg in self.segments for n in seg}


def _segments(gm: torch.fx.GraphModule) -> list[list[torch.fx.Node]]:
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    out, start, i = [], 0, 0
    while i < len(nodes):
        n = nodes[i]
        i += 1
        if n.op == "call_function" and n.target is _COND:
            while i < len(nodes) and nodes[i].target is _getitem and nodes[i].args[0] is n:
                i += 1
            out.append(nodes[start:i])
            start = i
    return out


def _carried(seg: list[torch.fx.Node], before: set[torch.fx.Node]) -> set[torch.fx.Node]:
    out: set[torch.fx.Node] = set()
    for n in seg:
        if n.target is _COND or (n.target is _getitem and n.args[0] in out) or any(
                a in out or a in before for a in n.all_input_nodes):
            out.add(n)
    return out


def _graph_key(gm: torch.fx.GraphModule, node: torch.fx.Node) -> Any:
    """A branch graph's structure; None where it holds tensor constants (their values are not compared)."""
    sub = getattr(gm, str(node.target), None)
    if not isinstance(sub, torch.fx.GraphModule):
        return None
    for m in sub.modules():
        if isinstance(m, torch.fx.GraphModule):
            for n in m.graph.nodes:
                if n.op == "get_attr" and not isinstance(getattr(m, str(n.target), None), torch.fx.GraphModule):
                    return None
                if n.op in ("call_module", "call_method"):
                    return None
    return graph_fingerprint(sub, layout=True)


class _Signer:
    """Describes segment k relative to segment k-1 (positions, not node identities, inside the pair)."""

    def __init__(self, gm: torch.fx.GraphModule, n_state: int):
        self.gm = gm
        self.state = {n for k, n in enumerate(gm.graph.nodes) if n.op == "placeholder" and k < n_state}
        self.graph_keys: dict[torch.fx.Node, Any] = {}

    def ref(self, a: torch.fx.Node, own: dict, prev: dict, prev_carried: set) -> Any:
        if a.op == "get_attr":  # a branch graph: equal when its structure is
            if a not in self.graph_keys:
                self.graph_keys[a] = _graph_key(self.gm, a)
            key = self.graph_keys[a]
            return ("graph", key) if key is not None else ("out", a)  # not comparable: never equal
        if a in own:
            return ("own", own[a])
        if a in prev:
            return ("prev", prev[a]) if a in prev_carried else ("prevfree", prev[a])
        if a in self.state:
            return ("state", layout_meta(a))
        return ("out", a)

    def sign(self, seg: list[torch.fx.Node], carried: set, prev: list[torch.fx.Node], prev_carried: set) -> tuple:
        own = {n: q for q, n in enumerate(seg)}
        before = {n: q for q, n in enumerate(prev)}

        def desc(a: Any) -> Any:
            if isinstance(a, torch.fx.Node):
                return self.ref(a, own, before, prev_carried)
            if isinstance(a, (list, tuple)):
                return (type(a).__name__, tuple(desc(x) for x in a))
            if isinstance(a, dict):
                return tuple(sorted((k, desc(v)) for k, v in a.items()))
            return ("const", type(a).__name__, repr(a))

        out = []
        for n in seg:
            if n in carried:
                out.append(("c", n.op, n.target, desc(n.args), desc(n.kwargs), layout_meta(n)))
            elif n.op == "get_attr":
                out.append(("g", self.ref(n, own, before, prev_carried)))
            else:  # free: computed per segment, so only its place and metadata must agree
                out.append(("f", n.op, n.target, layout_meta(n)))
        return tuple(out)


def find_runs(gm: torch.fx.GraphModule, n_state: int, min_run: int = MIN_RUN) -> list[Run]:
    """Maximal runs of at least `min_run` identical segments that a scan can compute."""
    segs = _segments(gm)
    signer = _Signer(gm, n_state)
    carried: list[set] = []
    sigs: list[tuple | None] = []
    for k, seg in enumerate(segs):
        prev_c = carried[k - 1] if k else set()
        carried.append(_carried(seg, prev_c))
        sigs.append(signer.sign(seg, carried[k], segs[k - 1], prev_c) if k else None)
    runs: list[Run] = []
    k = 1
    while k < len(segs):
        j = k
        while j + 1 < len(segs) and sigs[j + 1] == sigs[k]:
            j += 1
        # segments k..j read their predecessor alike; k-1 may start the run with values from outside
        first = k - 1 if _opens(segs[k - 1], sigs[k], signer, carried[k - 1]) else k
        run = _build(segs[first:j + 1], carried[first:j + 1], sigs[k], signer, gm) if j + 1 - first >= min_run else None
        if run is not None:
            runs.append(run)
        k = j + 1
    return runs


def _opens(seg: list[torch.fx.Node], sig: tuple | None, signer: _Signer, carried: set) -> bool:
    """Whether `seg` matches `sig` once its reads of the previous segment count as the carry's start."""
    if sig is None or len(seg) != len(sig):
        return False
    mine = signer.sign(seg, carried, [], set())

    def same(a: Any, b: Any) -> bool:
        if isinstance(b, tuple) and len(b) == 2 and b[0] == "prev":
            return isinstance(a, tuple) and len(a) == 2 and a[0] in ("out", "state")
        if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
            return all(same(x, y) for x, y in zip(a, b))
        return a == b

    return same(mine, sig)


def _slots(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The node's input nodes in argument order (with repeats), as fx's map_arg visits them."""
    out: list[torch.fx.Node] = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda a: out.append(a) or a)
    return out


def _build(segs: list[list[torch.fx.Node]], carried_sets: list[set], sig: tuple, signer: _Signer,
           gm: torch.fx.GraphModule) -> Run | None:
    n = len(segs[0])
    carried = [q for q in range(n) if sig[q][0] == "c"]
    if any({q for q in range(n) if segs[k][q] in carried_sets[k]} != set(carried) for k in range(1, len(segs))):
        return None
    pos = [{node: q for q, node in enumerate(seg)} for seg in segs]
    carry: set[int] = set()
    xs: set[int] = set()
    init: dict[int, torch.fx.Node] = {}
    slot_state: dict[tuple[int, int], list[torch.fx.Node]] = {}
    for q in carried:
        for i in range(len(_slots(segs[0][q]))):
            refs = [_slots(seg[q])[i] for seg in segs]
            if refs[0].op == "get_attr":  # branch graphs: the signature compared their structure
                continue
            if refs[1] in pos[0]:  # the previous segment's value: the carry
                p = pos[0][refs[1]]
                if refs[1] not in carried_sets[0] or any(pos[k - 1].get(refs[k]) != p for k in range(1, len(segs))):
                    return None
                if init.setdefault(p, refs[0]) is not refs[0] or refs[0] in pos[0]:
                    return None
                carry.add(p)
            elif refs[0] in pos[0]:  # the segment's own node
                p = pos[0][refs[0]]
                if p not in carried:
                    xs.add(p)
            elif refs[0] in signer.state:
                if len(set(refs)) == len(refs):
                    slot_state[(q, i)] = refs
                elif len(set(refs)) != 1:
                    return None
    body = _body_free(segs, carried, signer, pos)
    if body is None:
        return None
    xs -= body
    carried = sorted(set(carried) | body)
    for q in body:  # what the body's free nodes read: the other free nodes, stacked
        for a in _slots(segs[0][q]):
            if a in pos[0] and a.op != "get_attr" and pos[0][a] not in carried:
                xs.add(pos[0][a])
    # carried values nothing later reads except through the carry
    where = {x: (k, q) for k, seg in enumerate(segs) for q, x in enumerate(seg)}
    inside = set(carried)
    for k, seg in enumerate(segs):
        for q in carried:
            for user in seg[q].users:
                if user not in where:  # after the run: only the last block's carry is there
                    if k != len(segs) - 1 or q not in carry:
                        return None
                    continue
                kk, qq = where[user]
                if qq not in inside or (kk != k and (kk != k + 1 or q not in carry)):
                    return None
    # a stacked placeholder is read only at its slot, by its own segment's carried nodes
    groups = list(dict.fromkeys(tuple(v) for v in slot_state.values()))
    members = [p for g in groups for p in g]
    if len(members) != len(set(members)):
        return None
    for g in groups:
        for k, ph in enumerate(g):
            if any(u not in segs[k] or pos[k][u] not in carried for u in ph.users):
                return None
    gathered = {q for q in xs if _gatherable([seg[q] for seg in segs])}
    return Run(segs, carried, sorted(carry), init, sorted(xs), gathered=gathered, groups=groups)


def _body_free(segs: list[list[torch.fx.Node]], carried: list[int], signer: _Signer,
               pos: list[dict]) -> set[int] | None:
    """Free positions the scan body can compute: equal in every segment (constants included),
    reading no state of their own block and read by no free node that is not."""
    full = [signer.sign(seg, set(seg), [], set()) for seg in segs]
    free = [q for q in range(len(segs[0])) if q not in set(carried) and segs[0][q].op == "call_function"]
    body = {q for q in free if all(f[q] == full[0][q] for f in full)
            and not any(a in signer.state for a in segs[0][q].all_input_nodes)}
    changed = True
    while changed:  # a node computed outside the body needs its inputs outside too
        changed = False
        for q in free:
            if q in body:
                continue
            for a in segs[0][q].all_input_nodes:
                if a in pos[0] and pos[0][a] in body:
                    body.discard(pos[0][a])
                    changed = True
    return body


def _gatherable(nodes: list[torch.fx.Node]) -> bool:
    """`select(x, dim, t_k)` in every segment, on one x and dim: the blocks' values are one gather."""
    first = nodes[0]
    return all(n.target is torch.ops.aten.select.int and len(n.args) == 3 and not n.kwargs
               and n.args[:2] == first.args[:2] and isinstance(n.args[2], int) for n in nodes)
