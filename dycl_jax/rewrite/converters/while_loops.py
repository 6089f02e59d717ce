"""`while` → while_loop operator with an explicit carry (the loop variables) and invariants."""
from __future__ import annotations

import ast

from dycl_jax.analysis.scopes import access, block_access
from dycl_jax.rewrite.converters import view_updates
from dycl_jax.rewrite.converters.branches import (check_body, deep_updates, element_hazards, kept_aliases, liveness,
                                                  made_aliases, nested_owned, own_prefix)
from dycl_jax.rewrite.templates import Context, assign, function, last_assignment_line, locate, op_call, tuple_of


def convert_while(node: ast.While, block: list[ast.stmt], scope: ast.FunctionDef, ctx: Context) -> None:
    if getattr(node, "_dycl_static", False):
        return
    check_body(node.body, f"the `while` at line {node.lineno}", ctx.src)
    live = liveness(scope)
    body_acc = block_access(node.body)
    at_header = live.header(node)
    carried = sorted(body_acc.writes & at_header & live.locals)
    reads = (body_acc.reads | body_acc.mutates | access(node.test).reads) & live.locals
    updated = (body_acc.mutates | nested_owned(node.body)) & set(carried)
    views = view_updates.find(node, block, updated, live.after(node) & live.locals)
    remade = {r.view for r in views}  # made again after the loop from its new base: not loop variables
    carried = sorted({*carried, *_kept_with(updated, body_acc.binds, at_header & live.locals,
                                            (reads | live.after(node)) - remade,
                                            getattr(ctx.src.tree, "_dycl_aliases", None))})
    invariants = sorted((reads & at_header) - set(carried))
    params = carried + invariants
    lines = (tuple(None for _ in carried), tuple(last_assignment_line(node.body, v) for v in carried))
    kept = kept_aliases(live, node, [node.body], carried, always_unchanged=True)
    owned = ((body_acc.mutates & live.updated_on_entry(node.body)) | nested_owned(node.body)) & set(carried)
    deep = owned & deep_updates(node.body)  # of them, containers whose tensors it updates in place
    live_after = tuple(sorted(n for n in live.after(node) & live.locals if not n.startswith("_dycl_"))) if owned else ()
    site = ctx.add_site("while", node.lineno, tuple(carried), ("value before the loop", "value after an iteration"),
                        lines, owned=tuple(sorted(owned)), live_after=live_after, kept_aliases=kept,
                        inputs=tuple(params), unbound=tuple(n for n in carried if n not in body_acc.binds),
                        rederived=tuple((r.view, r.base) for r in views),
                        deep=tuple(sorted(deep)), made_aliases=made_aliases(live, node, [node.body], carried),
                        kept_elements=element_hazards(live, node, kept))
    stem = ctx.fresh("while")
    test_fn = function(f"{stem}_test", params, [locate(ast.Return(value=node.test), node)], None)
    body_fn = function(f"{stem}_body", params, own_prefix(owned, params, node, deep) + node.body, carried)
    for fn in (test_fn, body_fn):
        fn._dycl_generated = True  # type: ignore[attr-defined]
        locate(ast.copy_location(fn, node), node)
    carry, inv = tuple_of(carried), tuple_of(invariants)
    carry._dycl_inputs = inv._dycl_inputs = True  # type: ignore[attr-defined]
    call = op_call("while_loop", ast.Name(id=test_fn.name, ctx=ast.Load()),
                   ast.Name(id=body_fn.name, ctx=ast.Load()), carry, inv, site=site)
    stmt = locate(ast.copy_location(assign(carried, call), node), node)
    i = next(k for k, s in enumerate(block) if s is node)
    block[i:i + 1] = view_updates.wrap([test_fn, body_fn, stmt], views, ctx.fresh, node) + node.orelse


def _kept_with(updated: set[str], binds: set[str], defined: set[str], needed: set[str], aliases) -> set[str]:
    """Names the body never rebinds that may be the same tensor as one it updates in place and
    never rebinds (`a = v`, then `a[0] = ...` in the body, `v` read in it or after): loop
    variables too, so that where they are one tensor at the loop the operator carries them as
    one (`Site.unbound`) and each name sees every update, as in torch."""
    if aliases is None:
        return set()
    fixed = updated - binds
    return {m for m in defined & needed if m not in binds and not m.startswith("_dycl_") and m not in updated
            and any(aliases.same(m, n) for n in fixed)}
