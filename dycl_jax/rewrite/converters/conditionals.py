"""`if/else` → cond with pure branch functions; `if/elif/.../else` chains → switch."""
from __future__ import annotations

import ast

from dycl_jax.rewrite.appends import rebound
from dycl_jax.rewrite.converters.branches import (check_body, deep_updates, element_hazards, kept_aliases, liveness,
                                                  made_aliases, own_prefix, signature)
from dycl_jax.rewrite.converters import view_updates
from dycl_jax.rewrite.converters.flags import dead_on_exit, sets_flag
from dycl_jax.rewrite.templates import (Context, assign, function, lambda_, last_assignment_line, locate, name,
                                        op_call, tuple_of)


def _kept(node: ast.If) -> bool:
    return getattr(node, "_dycl_keep", False)


def chain_nodes(node: ast.If) -> list[ast.If]:
    """The `if` and its `elif`s (an `else:` holding exactly one `if` counts as an `elif`)."""
    nodes = [node]
    while len(nodes[-1].orelse) == 1 and isinstance(nodes[-1].orelse[0], ast.If) \
            and not _kept(nodes[-1].orelse[0]) and not getattr(nodes[-1].orelse[0], "_dycl_guard", False):
        nodes.append(nodes[-1].orelse[0])
    return nodes


def _all_static(node: ast.If) -> bool:
    return all(getattr(n, "_dycl_static", False) for n in chain_nodes(node))


def is_chain_member(node: ast.If, parent: ast.AST | None) -> bool:
    """An `elif` is converted together with the `if` that starts its chain."""
    return isinstance(parent, ast.If) and parent.orelse == [node] and not _kept(node) \
        and not getattr(node, "_dycl_guard", False) and not getattr(parent, "_dycl_guard", False) \
        and not _kept(parent)


def _exit_branch(bodies: list[list[ast.stmt]], outputs: list[str], ctx: Context) -> tuple[str, int] | None:
    """(flag, k) where branch k of an `if`/`else`, and only it, sets a loop's break flag by a
    statement of its own (so on every path through it): `if c: break`. (The other branch may
    break further on, behind guards of its own.)"""
    found = []
    for f in outputs:
        if ctx.exits.get(f, ("",))[0] != "break":
            continue
        sets = [any(isinstance(s, ast.Assign) and sets_flag(s, f) and isinstance(s.value, ast.Constant)
                    and s.value.value is True for s in b) for b in bodies]
        found += [(f, k) for k in (0, 1) if sets[k]]
    return found[0] if len(found) == 1 else None


def convert_if(node: ast.If, block: list[ast.stmt], scope: ast.FunctionDef, ctx: Context) -> None:
    if _kept(node) or _all_static(node):
        return
    nodes = chain_nodes(node)
    tests = [n.test for n in nodes]
    bodies = [n.body for n in nodes] + [nodes[-1].orelse]
    for b in bodies:
        check_body(b, f"the `if` at line {node.lineno}", ctx.src)
    live = liveness(scope)
    aliases = getattr(ctx.src.tree, "_dycl_aliases", None)
    sig = signature(live, bodies, live.after(node), aliases)
    views = view_updates.find(node, block, set().union(*sig.owned), live.after(node) & live.locals)
    if views:  # the construct gives back each view's base and leaves the views to their re-derivation
        sig = signature(live, bodies, (live.after(node) | {r.base for r in views}) - {r.view for r in views},
                        aliases)
    guard = getattr(node, "_dycl_guard", False)
    kind = "guard" if guard else ("elif" if len(tests) > 1 else "if")
    if len(tests) == 1:
        paths = ("true branch", "false branch")
    else:
        paths = ("`if` branch", *(f"`elif` branch at line {n.lineno}" for n in nodes[1:]), "`else` branch")
    lines = tuple(tuple(last_assignment_line(b, v) for v in sig.outputs) for b in bodies)
    dead = dead_on_exit(node, sig.outputs, live, ctx) if len(tests) == 1 else ()
    owned = set().union(*sig.owned)
    live_after = tuple(sorted(n for n in live.after(node) & live.locals if not n.startswith("_dycl_"))) if owned else ()
    kept = kept_aliases(live, node, bodies, sig.outputs)
    pad = ctx.unroll is not None and scope is ctx.src.tree  # the method's own joins (padding.py)
    flags = tuple(sorted(getattr(node, "_dycl_flags", ())))
    changed = rebound([*tests, *(s for b in bodies for s in b)])
    in_place = tuple(n for n in sig.outputs if n in sig.inputs and n not in changed)
    site = ctx.add_site(kind, node.lineno, tuple(sig.outputs), paths, lines, dead, tuple(sorted(owned)), live_after,
                        kept, pad, flags, tuple(sig.inputs), in_place,
                        rederived=tuple((r.view, r.base) for r in views),
                        made_aliases=made_aliases(live, node, bodies, sig.outputs),
                        kept_elements=element_hazards(live, node, kept),
                        exit_branch=_exit_branch(bodies, sig.outputs, ctx) if len(tests) == 1 else None)
    stem = ctx.fresh("if" if kind != "elif" else "case")
    fns = []
    for k, (body, owned) in enumerate(zip(bodies, sig.owned)):
        own = own_prefix(owned, sig.inputs, node, deep_updates(body) if owned else set())
        fn = function(f"{stem}_{k}", sig.inputs, own + body, sig.outputs)
        fn._dycl_generated = True  # type: ignore[attr-defined]
        fns.append(locate(ast.copy_location(fn, body[0] if body else node), node))
    inputs = tuple_of(sig.inputs)
    inputs._dycl_inputs = True  # type: ignore[attr-defined]
    if len(tests) == 1:
        call = op_call("cond", tests[0], name(fns[0].name), name(fns[1].name), inputs, site=site)
    else:
        preds = ast.Tuple(elts=[lambda_([], t) for t in tests], ctx=ast.Load())
        call = op_call("switch", preds, ast.Tuple(elts=[name(f.name) for f in fns], ctx=ast.Load()), inputs, site=site)
    stmt = locate(ast.copy_location(assign(sig.outputs, call), node), node)
    stmt._dycl_in_place = frozenset(in_place)  # type: ignore[attr-defined]  (not a rebinding: appends.rebound)
    i = next(k for k, s in enumerate(block) if s is node)
    block[i:i + 1] = view_updates.wrap([*fns, stmt], views, ctx.fresh, node)
