"""The ordered list of converters; each takes one function scope and a shared Context."""
from __future__ import annotations

import ast
from typing import Callable

from dycl_jax.analysis.aliases import Aliases
from dycl_jax.analysis.scopes import function_locals
from dycl_jax.rewrite.converters import (attribute_stores, bounded_rows, branches, chosen_receivers, closure_refresh, counted_while, decode_loops, dispatch_split, helpers, host_reads, host_values, jump_else, logical, loop_exits, predicates,
                                         returns, self_attributes, side_effects, structured, super_calls, tensor_data,
                                         ternary, undefined_init, unread_lists)
from dycl_jax.rewrite.templates import Context, user_scopes

# Order matters: exits become flags (loops stop on them, see converters/loop_finalize.py)
# before the flag guards are converted into conds; the static/dynamic marks are taken before
# `and`/`or` turn into calls; undefined-variable initialisation needs every generated call.
PIPELINE: list[tuple[str, Callable[[ast.FunctionDef, Context], None]]] = [
    ("bounded_rows", bounded_rows.convert),  # first: it matches the user's statements as written
    ("closure_refresh", closure_refresh.convert),  # before any body moves into a generated function
    ("super_calls", super_calls.convert),
    ("chosen_receivers", chosen_receivers.convert),  # before the static marks: its `if` takes one
    ("side_effects", side_effects.convert),
    ("unread_lists", unread_lists.convert),  # after side_effects: a dropped `self.log = xs` was a read of xs
    ("self_attributes", self_attributes.convert),  # after side_effects: an attribute no output reads is gone
    ("attribute_stores", attribute_stores.convert),  # after self_attributes: its locals need no guard
    ("helpers", helpers.convert),
    ("tensor_data", tensor_data.convert),
    ("predicates", predicates.convert),
    ("host_values", host_values.convert),  # after the static marks: `xs[i]` in a test stays static
    ("counted_while", counted_while.convert),  # before exits become flags: its `for` takes them as any `for` does
    ("decode_loops", decode_loops.convert),  # only with max_len: before jump_else, as its exits are returns
    ("jump_else", jump_else.convert),  # before exits become flags: one cond per complete path
    ("returns", returns.convert),
    ("loop_exits", loop_exits.convert),
    ("ternary", ternary.convert),
    ("logical", logical.convert),
    ("structured", structured.convert),  # if/elif (conditionals.py) and while (while_loops.py), inner first
    ("undefined_init", undefined_init.convert),
]


# The dispatch host's rewrite: control flow stays Python; simple statements become regions.
# (No bounded row selections: host="dispatch" runs a selection with its exact row count.)
# (No closure refresh: a region takes a closure's cells as inputs when it starts, so a copy defined
# on the host would still miss a reassignment made inside the region; api._rewrite refuses it.)
DISPATCH_PIPELINE: list[tuple[str, Callable[[ast.FunctionDef, Context], None]]] = [
    ("super_calls", super_calls.convert),
    ("chosen_receivers", chosen_receivers.convert),
    ("side_effects", side_effects.convert),
    ("unread_lists", unread_lists.convert),
    ("self_attributes", self_attributes.convert),  # the same locals as the staged rewrite (islands)
    ("attribute_stores", attribute_stores.convert_dispatch),  # islands keep the guards
    ("helpers", helpers.convert),
    ("counted_while", counted_while.convert),  # the loop can then be one staged island
    ("predicates", predicates.convert),  # static marks; `.item()` in dynamic tests stays a tensor
    ("host_reads", host_reads.convert),  # `n = (t - 1).tolist()`: the subtraction joins the region
    ("dispatch_split", dispatch_split.convert),
]


def run(ctx: Context, upto: str | None = None, dispatch: bool = False) -> ast.FunctionDef:
    """Apply the pipeline (optionally only up to and including converter `upto`) in place."""
    pipeline = DISPATCH_PIPELINE if dispatch else PIPELINE
    if upto is not None and upto not in dict(pipeline):
        raise ValueError(f"no converter named {upto!r}")
    tree = ctx.src.tree
    tree._dycl_aliases = Aliases(tree)  # type: ignore[attr-defined]  (of the user's code, before any rewrite)
    scopes = user_scopes(tree)[::-1]  # nested defs first
    for scope in scopes:  # converters move code into generated functions; these stay the user's locals
        scope._dycl_user_locals = function_locals(scope)  # type: ignore[attr-defined]
        scope._dycl_param_updates = branches.param_updates(scope)  # type: ignore[attr-defined]  (see liveness)
    for stage, convert in pipeline:
        for scope in scopes:
            convert(scope, ctx)
        if stage == upto:
            break
    return tree
