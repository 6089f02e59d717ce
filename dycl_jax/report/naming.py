"""Names the sub-networks of a lowered program, and their inputs and outputs, in the user's terms.

A branch graph becomes `then-branch of if at model.py:113` (its construct and line, from the
decision-site label the rewrite gave the `cond` / `while_loop` node); a value becomes the user's
variable (the outputs of a construct as the rewrite's output plan recorded them, rewrite/names.py;
a computed value by the variable its line assigns), or the parameter path it reads.
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field

import torch
import torch.fx

from dycl_jax.lower.interpreter import LoweredGraph, node_site, user_locations
from dycl_jax.rewrite import names as rewrite_names

_COND = torch.ops.higher_order.cond
_WHILE = torch.ops.higher_order.while_loop
# `name = ...`, `name[i] = ...`, `name += ...`: the variable a line assigns; `a, b = ...` is
# ambiguous (which target is this value?), `return ...` passes the value to the caller's line
_ASSIGN = re.compile(r"^\s*([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*(?:[-+*/@%|&^]|//)?=(?!=)")
_TUPLE_ASSIGN = re.compile(r"^\s*\(?\s*[A-Za-z_][\w.]*\s*(?:\[[^\]]*\])?\s*,[^=]*=(?!=)")


@dataclass(frozen=True)
class Value:
    """Where a graph value comes from: a user variable, or state (a parameter path)."""

    name: str
    state: bool = False


@dataclass
class NamedGraph:
    """One lowered graph with its place in the program and its inputs and outputs named."""

    graph: LoweredGraph
    id: str  # "1", "1.2", "1.2.1": nesting in the host tree
    title: str  # "then-branch of if at model.py:113"
    site: str  # the decision-site label of the construct it belongs to ("" for the method)
    inputs: list[Value] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    children: list["NamedGraph"] = field(default_factory=list)
    construct: int = 0  # which control node of the parent graph runs it (its graphs share one)


def _where(label: str) -> str:
    return label.split("@", 1)[1] if "@" in label else label


def _roles(label: str, target: object, count: int, chain: int) -> list[str]:
    """Titles of a control node's graphs: (then, else) of a cond, (test, body) of a while."""
    kind, where = label.split("@", 1)[0] if "@" in label else "", _where(label)
    if target is _WHILE:
        return [f"test of while at {where}", f"body of while at {where}"]
    if kind == "elif":
        return [f"path {chain + 1} of if/elif at {where}", f"paths after {chain + 1} of if/elif at {where}"]
    if kind == "guard":  # `if not <exit flag>: <rest of the block>` (rewrite/converters/flags.py)
        return [f"rest from {where} (no exit yet)", f"skip from {where} (exited)"]
    if kind == "ifexp":
        return [f"true value of `x if c else y` at {where}", f"false value of `x if c else y` at {where}"]
    return [f"then-branch of {kind or 'cond'} at {where}", f"else-branch of {kind or 'cond'} at {where}"][:count]


def _assigned(node: torch.fx.Node) -> str | None:
    """The variable the user's line assigns this value to, from the innermost frame outwards."""
    for loc in user_locations(node):
        if _TUPLE_ASSIGN.match(loc.code):
            return None
        match = _ASSIGN.match(loc.code)
        if match:
            return match.group(1)
    return None


def _output_names(site: str, count: int) -> list[str]:
    recorded = rewrite_names.outputs(site, count)
    if recorded is not None:
        return [rewrite_names.readable(n) for n in recorded]
    return [f"{_where(site)} out {k}" for k in range(count)]


def _named_operands(operands: list[Value], label: str) -> list[Value]:
    """A cond's operands by the names the rewrite recorded for them, where the recorded list
    lines up with the node (same length, model state in the same places); else as found."""
    recorded = rewrite_names.inputs(label, len(operands))
    if recorded is None or any((r is None) != v.state for r, v in zip(recorded, operands)):
        return operands
    return [v if r is None else Value(rewrite_names.readable(r)) for r, v in zip(recorded, operands)]


def _out_count(node: torch.fx.Node) -> int:
    val = node.meta.get("val")
    return len(val) if isinstance(val, (list, tuple)) else 1


class _Namer:
    def walk(self, graph: LoweredGraph, ident: str, title: str, site: str, given: list[Value],
             out_names: list[str] | None, chain: int = 0) -> NamedGraph:
        env: dict[torch.fx.Node, Value] = dict(zip(graph.placeholders, given))
        named = NamedGraph(graph, ident, title, site, list(given))
        k = 0
        for c, step in enumerate(graph.steps):
            node = step.node
            if node.target in (_COND, _WHILE):
                label = step.site or node_site(node)
                outs = _output_names(label, _out_count(node))
                subs = [a for a in node.args if isinstance(a, torch.fx.Node) and a.op == "get_attr"]
                # operands: cond(pred, then, else, ops); while_loop(test, body, carry, extra)
                if node.target is _COND:
                    operands = _named_operands([self.value(env, o) for o in node.args[3]], label)
                    given_sub = [operands] * len(subs)
                else:
                    carry = [Value(n) for n in outs]
                    extra = [self.value(env, o) for o in node.args[3]]
                    given_sub = [carry + extra] * len(subs)
                roles = _roles(label, node.target, len(subs), chain)
                for j, (attr, role) in enumerate(zip(subs, roles)):
                    sub = graph.attrs.get(attr)
                    if not isinstance(sub, LoweredGraph):
                        continue
                    k += 1
                    nested = chain + 1 if (label.startswith("elif@") and j == 1) else 0
                    sub_outs = ["(loop test)"] if (node.target is _WHILE and j == 0) else outs
                    child = self.walk(sub, f"{ident}.{k}", role, label, given_sub[j], sub_outs, nested)
                    child.construct = c
                    named.children.append(child)
                for user in node.users:
                    if user.target is operator.getitem and isinstance(user.args[1], int):
                        idx = user.args[1]
                        env[user] = Value(outs[idx] if idx < len(outs) else user.name)
        result = graph.output_node.args[0] if graph.output_node is not None else ()
        leaves = list(result) if isinstance(result, (list, tuple)) else [result]
        if out_names is not None and len(out_names) == len(leaves):
            named.outputs = list(out_names)
        else:
            named.outputs = [self.value(env, o).name if isinstance(o, torch.fx.Node) else repr(o) for o in leaves]
        return named

    def value(self, env: dict[torch.fx.Node, Value], node: object) -> Value:
        if not isinstance(node, torch.fx.Node):
            return Value(repr(node))
        if node in env:
            return env[node]
        name = _assigned(node)
        return Value(name or node.name)


def name_program(graph: LoweredGraph, title: str, placeholder_values: list[Value]) -> NamedGraph:
    """The host tree of `graph` with every graph named (ids in depth-first order)."""
    result = graph.output_node.args[0] if graph.output_node is not None else ()
    n = len(result) if isinstance(result, (list, tuple)) else 1
    returned = ["return value"] if n == 1 else [f"return value[{k}]" for k in range(n)]
    return _Namer().walk(graph, "1", title, "", placeholder_values, returned)


def flat(root: NamedGraph) -> list[NamedGraph]:
    out = [root]
    for child in root.children:
        out.extend(flat(child))
    return out


def module_of(path: str) -> str:
    """`layers.1.conv1.weight` → `layers.1.conv1`; a top-level tensor belongs to the model itself."""
    return path.rsplit(".", 1)[0] if "." in path else "(model)"

