"""Example models converted once per test process: the default `to_jax` of an `examples.dynn`
example is the same program in every file that checks it, so the files share it."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import dycl_jax
from examples.dynn import load


@lru_cache(maxsize=None)
def default(name: str) -> tuple[Any, Any]:
    """(model, jm): `examples.dynn.<name>`'s seeded example model and `to_jax(model, args)` with
    every option at its default. Tests read both and never change them (a test that trains or
    changes the model converts its own)."""
    model, args = load(name).example()
    return model, dycl_jax.to_jax(model, args if isinstance(args, tuple) else (args,))
