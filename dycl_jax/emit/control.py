"""`torch.cond` → `jax.lax.cond` and `torch.while_loop` → `jax.lax.while_loop`, each with its
decision site and the user's file:line as a comment; branches and loop bodies as nested functions."""
from __future__ import annotations

import os
import re
from typing import Any

import torch
import torch.fx

from dycl_jax.emit import hierarchy
from dycl_jax.emit.bodies import Body, assigned_names
from dycl_jax.emit.ops import Expr, lit
from dycl_jax.lower.interpreter import node_location, node_site


def _subgraph(body: Body, node: Any) -> torch.fx.GraphModule:
    obj: Any = body.gm
    for part in str(node.target).split("."):
        obj = getattr(obj, part)
    return obj


def _comment(node: torch.fx.Node) -> str:
    """The decision site and the user's line it came from, as a comment above the construct."""
    loc = node_location(node)
    code = f": {loc.code.strip()}" if loc and loc.code else ""
    site = node_site(node)
    if site.startswith("guard@"):  # the rewrite's flag for an early return / break / continue
        where = f"{os.path.basename(loc.file)}:{loc.line}" if loc else "?"
        return f"# early exit (return/break/continue) from {where}{code}"
    return f"# {site}{code}"


def _graph_function(outer: Body, gm: torch.fx.GraphModule, name: str, params: list[str], bound: list,
                    unpack: bool, returned: list[str] | None = None) -> list[str]:
    """`def name(params): ...` for a branch or loop graph; placeholders are `bound` (state, closures) or params."""
    inner = Body(outer.program, outer.context, gm, reserved=set(outer.reserved) | set(outer.holder) | {name})
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    free = []
    for ph, b in zip(placeholders, bound):
        if isinstance(b, str) and b.startswith("state:"):
            outer.program.alias_state(ph, b[len("state:"):])
        elif b is None:
            free.append(ph)
        else:
            inner.env[ph] = Expr(b)
    for ph, p in zip(free, params):
        inner.env[ph] = Expr(p)
        inner.holder[p] = ph
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    items = hierarchy.build(nodes, outer.context, outer.program.inline, outer.program.classes)
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs = list(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) else [out_node.args[0]]
    exprs = inner.run(items, outs)
    if returned is not None:  # the names the body gives its results name the construct's outputs
        returned[:] = [re.sub(r"_\d+$", "", str(e)) if str(e).isidentifier() else "" for e in exprs]
    head = f"def {name}(carry):" if unpack else f"def {name}({', '.join(params)}):"
    lines = [head] + ([f"    {', '.join(params)}{',' if len(params) == 1 else ''} = carry"] if unpack else [])
    lines += ["    " + ln for ln in inner.lines]
    ret = ", ".join(lit(e) for e in exprs)
    lines.append(f"    return {ret}" if unpack and len(exprs) == 1 and name.startswith("test") else
                 f"    return ({ret}{',' if len(exprs) == 1 else ''})")
    return lines


def _operand_plan(body: Body, operands: list) -> tuple[list, list[str], list[str]]:
    """Per operand: "state:path" (read through self), a closure text (Python ints), or None (passed)."""
    bound, params, passed = [], [], []
    for op in operands:
        state = body.program.state_of(op) if isinstance(op, torch.fx.Node) else None
        if state is not None:
            bound.append(f"state:{state}")
            continue
        val = op.meta.get("val") if isinstance(op, torch.fx.Node) else op
        text = body._named(body.value(op)) if isinstance(op, torch.fx.Node) else Expr(lit(op))
        if not isinstance(val, torch.Tensor):
            bound.append(str(text))
            continue
        bound.append(None)
        passed.append(str(text))
        params.append(str(text) if str(text).isidentifier() and str(text) not in params else f"a{len(params)}")
    return bound, params, passed


def _output_names(body: Body, node: torch.fx.Node, graph: torch.fx.GraphModule, n: int) -> list[str]:
    out = next(x for x in graph.graph.nodes if x.op == "output").args[0]
    names = []
    for k in range(n):
        src = out[k] if isinstance(out, (list, tuple)) and k < len(out) else None
        while isinstance(src, torch.fx.Node) and src.target in (torch.ops.aten.clone.default,) and src.args:
            src = src.args[0]
        got = assigned_names(node_location(src)) if isinstance(src, torch.fx.Node) and src.op != "placeholder" else []
        user = next((u for u in node.users if u.args[1] == k), None)
        names.append(got[0] if len(got) == 1 else "out")
    return names


def emit_control(body: Body, node: torch.fx.Node, users: dict, line_of: dict, i: int) -> None:
    body.lines.append(_comment(node))
    loc = node_location(node)
    tag = str(loc.line) if loc else str(i)
    if node.target is torch.ops.higher_order.cond:
        pred, t, f, operands = node.args
        true_gm, false_gm = _subgraph(body, t), _subgraph(body, f)
        bound, params, passed = _operand_plan(body, list(operands))
        p = body.value(pred)
        val = pred.meta.get("val") if isinstance(pred, torch.fx.Node) else None
        if isinstance(val, torch.Tensor) and (val.dim() or val.dtype != torch.bool):
            p = Expr(f"{lit(p)}.reshape(()).astype(bool)")
        names = [body.fresh(f"then_{tag}", node), body.fresh(f"else_{tag}", node)]
        returned: list[list[str]] = [[], []]
        for name, gm, ret in zip(names, (true_gm, false_gm), returned):
            body.lines += _graph_function(body, gm, name, params, bound, unpack=False, returned=ret)
        n_out = len(node.meta["val"]) if isinstance(node.meta.get("val"), (list, tuple)) else 1
        call = f"jax.lax.cond({lit(p)}, {names[0]}, {names[1]}{''.join(', ' + a for a in passed)})"
        wanted = [a or b or w for a, b, w in zip(*returned, _output_names(body, node, true_gm, n_out))]
    else:
        test, step, carried, additional = node.args
        test_gm, step_gm = _subgraph(body, test), _subgraph(body, step)
        bound_c, params, passed = _operand_plan(body, list(carried))
        bound_a, _, _ = _operand_plan(body, list(additional))
        if any(b is not None for b in bound_c):
            raise body.program.no_rule(node, "a while_loop carrying state or Python values")
        bound_a = [b if b is not None else body._named(body.value(a)) for b, a in zip(bound_a, additional)]
        names = [body.fresh(f"test_{tag}", node), body.fresh(f"body_{tag}", node)]
        returned = []
        for name, gm in zip(names, (test_gm, step_gm)):
            body.lines += _graph_function(body, gm, name, params, bound_c + bound_a, unpack=True, returned=returned)
        n_out = len(carried)
        init = ", ".join(passed) + ("," if len(passed) == 1 else "")
        call = f"jax.lax.while_loop({names[0]}, {names[1]}, ({init}))"
        wanted = [p if p.isidentifier() else w for p, w in zip(params, _output_names(body, node, step_gm, n_out))]
    for k in range(len(wanted)):  # liveness first, so two outputs never get one name
        getter = next((u for u in node.users if u.args[1] == k), None)
        body.last_use[(node, k)] = body.last_use.get(getter, -1) if getter is not None else -1
    outs = []
    for k, w in enumerate(wanted):
        body.last_use[(node, k)] = max(body.last_use[(node, k)], body.step + 1)
        outs.append(body.fresh(w, (node, k)))
    for k in range(len(wanted)):
        getter = next((u for u in node.users if u.args[1] == k), None)
        body.last_use[(node, k)] = body.last_use.get(getter, -1) if getter is not None else -1
    body.lines.append(f"{', '.join(outs)}{',' if len(outs) == 1 else ''} = {call}")
    body.env[node] = tuple(Expr(o) for o in outs)
