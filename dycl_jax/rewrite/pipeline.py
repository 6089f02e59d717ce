"""The ordered list of converters; each takes one function scope and a shared Context."""
from __future__ import annotations

import ast
from typing import Callable

from dycl_jax.rewrite.converters import (helpers, logical, loop_exits, predicates, returns,
                                         side_effects, structured, super_calls, ternary,
                                         undefined_init)
from dycl_jax.rewrite.templates import Context, user_scopes

# Order matters: exits become flags (loops stop on them, see converters/loop_finalize.py)
# before the flag guards are converted into conds; the static/dynamic marks are taken before
# `and`/`or` turn into calls; undefined-variable initialisation needs every generated call.
PIPELINE: list[tuple[str, Callable[[ast.FunctionDef, Context], None]]] = [
    ("super_calls", super_calls.convert),
    ("side_effects", side_effects.convert),
    ("helpers", helpers.convert),
    ("predicates", predicates.convert),
    ("returns", returns.convert),
    ("loop_exits", loop_exits.convert),
    ("ternary", ternary.convert),
    ("logical", logical.convert),
    ("structured", structured.convert),  # if/elif (conditionals.py) and while (while_loops.py), inner first
    ("undefined_init", undefined_init.convert),
]


def run(ctx: Context, upto: str | None = None) -> ast.FunctionDef:
    """Apply the pipeline (optionally only up to and including converter `upto`) in place."""
    if upto is not None and upto not in dict(PIPELINE):
        raise ValueError(f"no converter named {upto!r}")
    tree = ctx.src.tree
    scopes = user_scopes(tree)[::-1]  # nested defs first
    for stage, convert in PIPELINE:
        for scope in scopes:
            convert(scope, ctx)
        if stage == upto:
            break
    return tree
