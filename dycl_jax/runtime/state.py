"""Flax NNX state for a converted model: torch parameters, buffers and constants by path."""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx

from dycl_jax.capture.export import StateEntry
from dycl_jax.errors import DyclError
from dycl_jax.lower.dtypes import tensor_to_numpy


class Buffer(nnx.Variable):
    """A torch buffer (BatchNorm statistics, registered buffers): state, but not trained."""


class Constant(nnx.Variable):
    """A tensor constant the torch program closed over (plain tensor attributes)."""


class TorchModule(nnx.Module):
    """A node of the torch module tree; attributes are child nodes or variables."""


# "batch_stat": a buffer the program updates (BatchNorm statistics in a train=True conversion)
_KINDS: dict[str, type[nnx.Variable]] = {"param": nnx.Param, "buffer": Buffer, "constant": Constant,
                                         "batch_stat": nnx.BatchStat}


def build_module(entries: list[StateEntry]) -> tuple[TorchModule, list[nnx.Variable]]:
    """An NNX module tree mirroring the torch paths, and its variables in graph-input order."""
    root = TorchModule()
    variables: list[nnx.Variable] = []
    # a module registered under two names (`self.ds = m` and `block.downsample = m`) gives one
    # tensor two paths: one variable at both, so gradients add up and training keeps the tie
    by_tensor: dict[int, nnx.Variable] = {}
    for entry in entries:
        *parents, leaf = entry.path.split(".")
        node = root
        for part in parents:
            child = getattr(node, part, None)
            if child is None:
                child = TorchModule()
                setattr(node, part, child)
            node = child
        existing = getattr(node, leaf, None)
        if isinstance(existing, nnx.Variable):  # one tensor read under two names: share it
            variables.append(existing)
            continue
        var = by_tensor.get(id(entry.tensor))
        if var is None:
            var = _KINDS[entry.kind](jnp.asarray(tensor_to_numpy(entry.tensor, f"{entry.kind} {entry.path}")))
            by_tensor[id(entry.tensor)] = var
        setattr(node, leaf, var)
        variables.append(var)
    return root, variables


def canonical_paths(root: nnx.Module, variables: list[nnx.Variable]) -> list[str]:
    """Each variable's path in `nnx.state(root)`, which holds a shared variable once (under the
    first of its paths in sorted order)."""
    where = {id(v): ".".join(str(p) for p in path) for path, v in nnx.state(root).flat_state()}
    return [where[id(v)] for v in variables]


def flat_values(state: nnx.State, paths: list[str]) -> list[Any]:
    """Values of `state` in the order of `paths` (torch dotted paths)."""
    by_path = {".".join(str(p) for p in path): v for path, v in state.flat_state()}
    try:
        return [_value(by_path[p]) for p in paths]
    except KeyError as exc:
        raise DyclError(f"state has no entry {exc.args[0]!r}", fix="pass nnx.state(jm.module)") from None


def _value(v: Any) -> Any:
    return v.get_raw_value() if isinstance(v, nnx.Variable) else v


def with_values(state: nnx.State, values: dict[str, Any]) -> nnx.State:
    """A copy of `state` whose entries at the torch paths in `values` hold those values."""
    flat = []
    for path, v in state.flat_state():
        new = values.get(".".join(str(p) for p in path))
        if new is not None:
            v = v.replace(new) if isinstance(v, nnx.Variable) else new
        flat.append((path, v))
    return nnx.State.from_flat_path(flat)


def to_state_dict(state: nnx.State, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The torch `state_dict` of `state` (e.g. trained in JAX): one torch tensor per torch path.

    With `base` (the model's own `state_dict()`), entries the converted program never read are
    kept from it and each value takes the base entry's dtype (int64 buffers held as int32), so
    `model.load_state_dict(to_state_dict(state, model.state_dict()))` loads strictly.
    """
    out = dict(base) if base is not None else {}
    # tied tensors (one module under two names) appear once in `state`: every name of the
    # tensor gets the value, so load_state_dict cannot copy a stale alias over the new one
    names: dict[Any, list[str]] = {}
    for k, t in (base or {}).items():
        names.setdefault((t.data_ptr(), t.dtype, tuple(t.shape), t.stride()), []).append(k)
    aliases = {k: group for group in names.values() for k in group}
    for path, v in state.flat_state():
        name = ".".join(str(p) for p in path)
        t = torch.from_numpy(np.array(_value(v)))
        for alias in aliases.get(name, [name]):
            out[alias] = t.to(base[alias].dtype) if base is not None and alias in base else t
    return out
