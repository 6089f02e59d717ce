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
from dycl_jax.emit.ops import KEYS, Expr, lit
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
                    unpack: bool, returned: list[str] | None = None,
                    keyed_loop: bool = False) -> tuple[list[str], bool]:
    """`def name(params): ...` for a branch or loop graph; placeholders are `bound` (state, closures) or params.
    Also whether it draws random numbers. A loop function of a loop that draws (`keyed_loop`) takes
    the loop's key as its last carry: the body draws from `keys.loop(loop_key)` and moves the key on,
    as the converted model's loops do (each iteration its own key)."""
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
    outer.keyed |= inner.keyed  # a branch reads the enclosing call's keys
    if returned is not None:  # the names the body gives its results name the construct's outputs
        returned[:] = [re.sub(r"_\d+$", "", str(e)) if str(e).isidentifier() else "" for e in exprs]
    test = name.startswith("test")
    keyed_loop = unpack and (keyed_loop or inner.keyed)
    head = f"def {name}(carry{f', {KEYS}={KEYS}' if keyed_loop and not test else ''}):" if unpack else \
        f"def {name}({', '.join(params)}):"
    unpacked = params + (["loop_key"] if keyed_loop else [])
    lines = [head] + ([f"    {', '.join(unpacked)}{',' if len(unpacked) == 1 else ''} = carry"] if unpack else [])
    if keyed_loop and not test:
        lines.append(f"    {KEYS} = {KEYS}.loop(loop_key)  # this iteration's keys")
    lines += ["    " + ln for ln in inner.lines]
    ret = ", ".join([lit(e) for e in exprs] + (["jax.random.fold_in(loop_key, 0)"] if keyed_loop and not test else []))
    lines.append(f"    return {ret}" if unpack and len(exprs) == 1 and test else
                 f"    return ({ret}{',' if len(exprs) == 1 and not (keyed_loop and not test) else ''})")
    return lines, inner.keyed


def _operand_plan(body: Body, operands: list, carried: bool = False) -> tuple[list, list[str], list[str]]:
    """Per operand: "state:path" (read through self), a closure text (Python ints), or None (passed).
    A loop's `carried` state (a train-mode BatchNorm statistic updated each iteration) is passed."""
    bound, params, passed = [], [], []
    for op in operands:
        state = body.program.state_of(op) if isinstance(op, torch.fx.Node) else None
        if state is not None and carried:
            bound.append(None)
            passed.append(body.program.state_expr(state, body.context))
            leaf = state.rpartition(".")[2]
            params.append(leaf if leaf not in params and leaf not in body.holder else f"a{len(params)}")
            continue
        if state is not None:
            bound.append(f"state:{state}")
            continue
        val = op.meta.get("val") if isinstance(op, torch.fx.Node) else op
        # a copy of a state value (a statistic a loop carries) is named after it
        read = [body.program.state_of(a) for a in op.all_input_nodes] if isinstance(op, torch.fx.Node) else []
        wanted = read[0].rpartition(".")[2] if len(read) == 1 and read[0] else "t"
        text = body._named(body.value(op), wanted) if isinstance(op, torch.fx.Node) else Expr(lit(op))
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
    keyed = False
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
            body.lines += _graph_function(body, gm, name, params, bound, unpack=False, returned=ret)[0]
        n_out = len(node.meta["val"]) if isinstance(node.meta.get("val"), (list, tuple)) else 1
        call = f"jax.lax.cond({lit(p)}, {names[0]}, {names[1]}{''.join(', ' + a for a in passed)})"
        wanted = [a or b or w for a, b, w in zip(*returned, _output_names(body, node, true_gm, n_out))]
    else:
        test, step, carried, additional = node.args
        test_gm, step_gm = _subgraph(body, test), _subgraph(body, step)
        bound_c, params, passed = _operand_plan(body, list(carried), carried=True)
        bound_a, _, _ = _operand_plan(body, list(additional))
        if any(b is not None for b in bound_c):
            raise body.program.no_rule(node, "a while_loop carrying Python values")
        bound_a = [b if b is not None else body._named(body.value(a)) for b, a in zip(bound_a, additional)]
        names = [body.fresh(f"test_{tag}", node), body.fresh(f"body_{tag}", node)]
        returned = []
        # the body first: whether it draws random numbers decides the carry (the loop's key) of both
        step_lines, keyed = _graph_function(body, step_gm, names[1], params, bound_c + bound_a, unpack=True,
                                            returned=returned)
        test_lines, test_keyed = _graph_function(body, test_gm, names[0], params, bound_c + bound_a, unpack=True,
                                                 keyed_loop=keyed)
        if test_keyed:
            raise body.program.no_rule(node, "a loop test drawing random numbers")
        body.lines += test_lines + step_lines
        n_out = len(carried)
        # the loop's first key is drawn where the loop starts (the converted model's order)
        init = ", ".join(passed + ([f"{KEYS}()"] if keyed else [])) + ("," if len(passed) == 1 and not keyed else "")
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
    lhs = outs + (["_"] if keyed else [])  # a loop that draws also returns its last key
    body.lines.append(f"{', '.join(lhs)}{',' if len(lhs) == 1 else ''} = {call}")
    body.env[node] = tuple(Expr(o) for o in outs)
