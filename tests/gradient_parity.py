"""Parameter gradients of a converted model against torch autograd on the ORIGINAL module,
one input per path: the check the dynamic-network tests run after their forward parity."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from dycl_jax.rewrite.padding import Padded


def _loss_torch(out) -> torch.Tensor:
    leaves = torch.utils._pytree.tree_leaves(out)
    return sum(v.sum() for v in leaves if isinstance(v, torch.Tensor) and v.is_floating_point())


def _loss_jax(out) -> jax.Array:
    # a padded output (`jm.apply` of a padded program) counts its true part only, as torch's exact one
    leaves = jax.tree_util.tree_leaves(out, is_leaf=lambda v: isinstance(v, Padded))
    return sum(_true_part(v).sum() for v in leaves
               if jnp.issubdtype(v.value.dtype if isinstance(v, Padded) else v.dtype, jnp.floating))


def _true_part(v) -> jax.Array:
    """`v`, or a Padded value with its padding zeroed: the elements below its length on every axis."""
    if not isinstance(v, Padded):
        return jnp.asarray(v)
    value = jnp.asarray(v.value)
    keep = jnp.ones(value.shape, bool)
    for axis in range(value.ndim):
        keep &= jax.lax.broadcasted_iota(jnp.int32, value.shape, axis) < v.lengths[axis]
    return jnp.where(keep, value, 0)


def one_per_path(mod, model, inputs: list[tuple], labels: list[tuple] | None = None) -> list[tuple]:
    """The first of `inputs` that takes each path label of `mod.path_of` not taken before;
    `labels`, if given, are `mod.path_of` of each input already (torch is not run again)."""
    chosen, seen = [], set()
    for k, args in enumerate(inputs):
        labels_k = set(labels[k] if labels is not None else mod.path_of(model, args))
        if labels_k - seen:
            chosen.append(args)
            seen |= labels_k
    return chosen


def fewest_covering(mod, model, inputs: list[tuple]) -> list[tuple]:
    """A few of `inputs` that together take every label of `mod.PATHS` (greedily, the input that
    takes the most labels not yet taken, the earliest of equals), in their order in `inputs`: on
    the dispatch host each input of new sizes costs captures and compiles, so every path is
    checked at the fewest signatures. Fails where `inputs` miss a path."""
    labels = [set(mod.path_of(model, args)) for args in inputs]
    todo, picked = set(mod.PATHS), []
    while todo:
        k = max(range(len(inputs)), key=lambda i: (len(labels[i] & todo), -i))
        assert labels[k] & todo, f"no input takes {sorted(todo)}"
        picked.append(k)
        todo -= labels[k]
    return [inputs[k] for k in sorted(picked)]


def assert_gradients_match(model: torch.nn.Module, jm, cases: list[tuple], what: str) -> None:
    """d(sum of the float outputs)/d(parameters) by `jax.grad(jm.apply)` (jitted once, through
    lax.cond and bounded fori_loops) equals torch autograd within 1e-4 (relative to the
    largest gradient of the parameter where that exceeds 1) on every case."""
    params, rest = nnx.state(jm.module).split(nnx.Param, ...)
    grad = jax.jit(jax.grad(lambda p, r, *a: _loss_jax(jm.apply(nnx.merge_state(p, r), *a))))
    reached: set[str] = set()
    compared = 0
    for k, args in enumerate(cases):
        model.zero_grad()
        try:
            out = model(*args)
        except RuntimeError as exc:
            # research code that reduces tensors with numpy (shallow_deep's `np.argmax(confidences)`
            # on its fallback path) cannot run under torch autograd at all: no reference there
            if "requires grad" in str(exc):
                continue
            raise
        _loss_torch(out).backward()
        compared += 1
        arrays = [a.detach().numpy() if isinstance(a, torch.Tensor) else a for a in args]
        flat = grad(params, rest, *arrays).flat_state()
        got = {".".join(map(str, p)): np.asarray(v.get_raw_value()) for p, v in flat}
        for name, p in model.named_parameters():
            want = p.grad.numpy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
            scale = max(1.0, float(np.abs(want).max()))
            np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-4 * scale,
                                       err_msg=f"{what} case {k}: {name}")
            reached |= {name} if np.abs(want).max() > 0 else set()
    assert compared and reached, f"{what}: nothing compared, or no parameter got a gradient"  # not vacuous
