"""Helpers for scripts/bench.py: finding the example models and shaping their inputs."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree

from dycl_jax.report.parity import compare

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Entry:
    """One example file to benchmark."""

    name: str
    # "static": batch 1 and 32; "dynn": stages, every host at batch 1 over inputs(n);
    # "dispatch": needs the dispatch host, torch vs host="auto" at batch 1 over inputs(n)
    kind: str
    path: Path


def discover(dynn: bool, only: str | None = None) -> list[Entry]:
    """Static examples (examples/*.py) and, with `dynn`, the dynamic ones listed in examples/dynn."""
    found = [Entry(p.stem, "static", p) for p in sorted((ROOT / "examples").glob("*.py"))]
    found = [e for e in found if not e.path.name.startswith("_")]
    if dynn:
        from examples.dynn import BOUNDED_MODELS, CONSTANT_FLAG_MODELS, DISPATCH_MODELS, MODELS, PADDED_MODELS

        folder = ROOT / "examples" / "dynn"
        staged = MODELS + BOUNDED_MODELS + CONSTANT_FLAG_MODELS + PADDED_MODELS  # padded: auto stages them
        found += [Entry(n, "dynn", folder / f"{n}.py") for n in staged]
        found += [Entry(n, "dispatch", folder / f"{n}.py") for n in DISPATCH_MODELS if n not in PADDED_MODELS]
    return [e for e in found if only is None or e.name == only]


def leading_dim(args: tuple[Any, ...]) -> int | None:
    """The leading size of the first tensor argument: the example's batch size."""
    for leaf in pytree.tree_leaves(args):
        if isinstance(leaf, torch.Tensor) and leaf.dim() >= 1:
            return int(leaf.shape[0])
    return None


def repeat_batch(args: tuple[Any, ...], batch: int, dynamic: list[bool] | None = None) -> tuple[Any, ...]:
    """`args` with batch rows, repeating the example's rows (so token ids etc. stay valid).

    `dynamic[i]` says whether tensor leaf i has a batch dimension; without it, every tensor
    whose leading size equals the example batch is taken to have one.
    """
    base = leading_dim(args)
    leaves, spec = pytree.tree_flatten(args)
    k = 0
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor):
            continue
        is_batch = dynamic[k] if dynamic is not None else (leaf.dim() >= 1 and leaf.shape[0] == base)
        k += 1
        if is_batch:
            leaves[i] = leaf[torch.arange(batch) % leaf.shape[0]]
    return pytree.tree_unflatten(leaves, spec)


def to_jax_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Tensor leaves as JAX device arrays in dycl_jax's dtypes, so the timed JAX call does no copy."""
    import jax.numpy as jnp

    from dycl_jax.lower.dtypes import tensor_to_numpy

    def one(t: Any) -> Any:
        return jnp.asarray(tensor_to_numpy(t, "input")) if isinstance(t, torch.Tensor) else t

    return pytree.tree_map(one, args)


FLOAT_TOL = 1e-3  # largest absolute float difference from torch for which a speed is reported


def disagreement(ref: Any, out: Any) -> str:
    """Why `out` (JAX) is not torch's answer `ref`, or "": a speed is reported only for a model
    that computes torch's answer (floats within FLOAT_TOL, integers and bools exactly)."""
    c = compare(ref, out)
    bad = list(c["problems"])
    if c["match"] != c["total"]:
        bad.append(f"{c['total'] - c['match']} of {c['total']} integer/bool elements differ")
    if c["diff"] > FLOAT_TOL:
        bad.append(f"float outputs differ by {c['diff']:.3g}")
    return "; ".join(bad)
