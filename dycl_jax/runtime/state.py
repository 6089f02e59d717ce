"""Flax NNX state for a converted model: torch parameters, buffers and constants by path."""
from __future__ import annotations

from typing import Any

import jax
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
            # device_put, not jnp.asarray: the latter compiles a tiny XLA program per distinct shape
            # (~15 ms each); the array is a fresh copy either way (tensor_to_numpy's astype copies)
            var = _KINDS[entry.kind](jax.device_put(tensor_to_numpy(entry.tensor, f"{entry.kind} {entry.path}")))
            by_tensor[id(entry.tensor)] = var
        setattr(node, leaf, var)
        variables.append(var)
    return root, variables


def stack_groups(root: TorchModule, variables: list[nnx.Variable], paths: list[str],
                 groups: list[list[int]]) -> list[nnx.Variable] | None:
    """Replace each group of per-block variables (indices into `variables`, one role of every
    block of a rerolled run, lower/reroll.py) by one variable holding them stacked; returns the
    program's variables: the others in order, then one per group. The per-block variables leave
    the tree, so the state is held once. None where a member is also read elsewhere (a tie)."""
    grouped = [i for g in groups for i in g]
    others = [i for i in range(len(variables)) if i not in set(grouped)]
    ids = [id(variables[i]) for i in grouped]
    if len(set(ids)) != len(ids) or set(ids) & {id(variables[i]) for i in others}:
        return None
    stacked = []
    for g in groups:
        members = [variables[i] for i in g]
        names = [paths[i] for i in g]
        # stacked in numpy and put once: jnp.stack would compile a program per group
        value = jax.device_put(np.stack([np.asarray(m.get_raw_value()) for m in members]))
        var = type(members[0])(value, stacked_paths=tuple(names))
        for name in names:
            *parents, leaf = name.split(".")
            delattr(_node(root, parents), leaf)
        *parents, leaf = _stacked_name(root, names).split(".")
        setattr(_node(root, parents, create=True), leaf, var)
        stacked.append(var)
    return [variables[i] for i in others] + stacked


def _node(root: TorchModule, parts: list[str], create: bool = False) -> Any:
    node: Any = root
    for part in parts:
        child = getattr(node, part, None)
        if child is None and create:
            child = TorchModule()
            setattr(node, part, child)
        node = child
    return node


def _stacked_name(root: TorchModule, names: list[str]) -> str:
    """`rnet.blocks.0.1-17.conv1.weight` for blocks 1..17 of `rnet.blocks.0`: the one path part
    that differs, as first-last (else `stacked_<first path>`), made unique in the tree."""
    split = [n.split(".") for n in names]
    differ = [i for i in range(len(split[0])) if len({len(p) for p in split}) == 1 and len({p[i] for p in split}) > 1]
    if len(differ) == 1:
        parts = list(split[0])
        parts[differ[0]] = f"{split[0][differ[0]]}-{split[-1][differ[0]]}"
    else:
        parts = ["stacked_" + names[0].replace(".", "_")]
    base, n = ".".join(parts), 1
    name = base
    while _exists(root, name.split(".")):
        n += 1
        name = f"{base}_{n}"
    return name


def _exists(root: TorchModule, parts: list[str]) -> bool:
    node: Any = root
    for part in parts:
        node = getattr(node, part, None)
        if node is None:
            return False
    return True


def path_values(variables: list[nnx.Variable], paths: list[str]) -> dict[str, Any]:
    """Every torch path's value: a stacked variable gives each of its blocks' paths its row."""
    out: dict[str, Any] = {}
    for path, var in zip(paths, variables):
        value = var.get_raw_value()
        members = getattr(var, "stacked_paths", None)
        out.update(zip(members, value) if members else [(path, value)])
    return out


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
        members = getattr(v, "stacked_paths", None)  # a rerolled run's stacked role: one row per block
        rows = zip(members, np.array(_value(v))) if members else [(name, np.array(_value(v)))]
        for member, row in rows:
            t = torch.from_numpy(np.array(row))
            for alias in aliases.get(member, [member]):
                out[alias] = t.to(base[alias].dtype) if base is not None and alias in base else t
    return out
