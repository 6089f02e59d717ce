"""`dycl_jax.load(path)`: runs an artifact written by `jm.export` with jax, numpy and
safetensors only (this module imports nothing of torch, nor any dycl_jax module that does)."""
from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
from typing import Any, Iterator

import jax
import numpy as np
from jax import export as jax_export
from safetensors.flax import load_file, save_file

from dycl_jax.errors import CallError, DyclError, decode_bound_error
from dycl_jax.rewrite.decisions import Decision

FORMAT = "dycl_jax.artifact/1"
# dispatch-host artifacts (runtime/hosted.py); /2 adds the parts' list identities (`same`,
# `in_place`, `shared_on_host`), which a /1 reader would drop, splitting one list into several
HOSTED_FORMAT = "dycl_jax.hosted/2"
HOSTED_READ = ("dycl_jax.hosted/1", HOSTED_FORMAT)
MANIFEST, PARAMS, PROGRAM, TRACE = "manifest.json", "params.safetensors", "program.stablehlo", "trace.stablehlo"
_INT32 = (-(2**31), 2**31 - 1)


def save_params(path: str, paths: list[str], values: list[Any]) -> None:
    """The state arrays under their torch paths (a path read twice is one tensor, stored once)."""
    save_file({p: v for p, v in zip(paths, values)}, path)


def load(path: str) -> "LoadedModel":
    """The artifact directory `path` (from `jm.export(path)`) as a callable model."""
    try:
        with open(os.path.join(path, MANIFEST)) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise DyclError(f"{path} holds no {MANIFEST}", fix="pass a directory written by jm.export(path)") from None
    if manifest.get("format") in HOSTED_READ:  # a dispatch-host model (runtime/hosted.py)
        from dycl_jax.runtime.hosted import HostedModel
        return HostedModel(path, manifest)  # type: ignore[return-value]
    if manifest.get("format") != FORMAT:
        raise DyclError(f"{path} is an artifact of format {manifest.get('format')!r}; this dycl_jax reads {FORMAT}",
                        fix="export the model again with this version of dycl_jax")
    return LoadedModel(path, manifest)


def key_data(spec: dict, key: Any) -> Any:
    """A train=True artifact's key argument as the raw key data its programs take (`spec`: the
    manifest's `train.key`): from a `jax.random.key`, its data, or an int seed."""
    if key is None:
        raise CallError("a train=True artifact needs key= for its random ops (dropout, ...)",
                        fix="pass key=jax.random.key(seed)")
    if isinstance(key, int) and not isinstance(key, bool):
        key = jax.random.key(key, impl=spec["impl"])
    if jax.dtypes.issubdtype(getattr(key, "dtype", None), jax.dtypes.prng_key):
        if str(jax.random.key_impl(key)) != spec["impl"]:
            raise CallError(f"the key is a {jax.random.key_impl(key)} key; this artifact draws with {spec['impl']}",
                            fix=f"pass jax.random.key(seed, impl={spec['impl']!r})")
        key = jax.random.key_data(key)
    data = np.asarray(key)
    if list(data.shape) != spec["shape"] or data.dtype.name != spec["dtype"]:
        raise CallError(f"key: expected a key or its data {spec['dtype']}{spec['shape']}, "
                        f"got {data.dtype.name}{list(data.shape)}", fix="pass key=jax.random.key(seed)")
    return data


class LoadedModel:
    """A deployed converted model: `m(*args)` as `jm(*args)`, `m.trace(*args)` as `jm.trace`."""

    def __init__(self, path: str, manifest: dict):
        self.manifest = manifest
        self.x64 = bool(manifest["x64"])
        with self._scope():
            params = load_file(os.path.join(path, PARAMS))
            self._state = [params[p] for p in manifest["state"]]
            self._program = jax.jit(_read(path, PROGRAM).call)
            self._trace = jax.jit(_read(path, TRACE).call)
        self._sites = [tuple(s) for s in manifest["trace"]["sites"]]
        # a train=True program: takes key data last, returns (outputs, updated statistics)
        self._train = manifest.get("train")
        if self._train is not None:
            state = manifest["state"]
            self._updated = [[i for i, q in enumerate(state) if q == p] for p in self._train["updated"]]
        # arguments that are exactly the inputs, in order: a passed (type, shape, dtype) key is
        # remembered, so a repeat call skips the structure walk and the checks
        n = len(manifest["inputs"])
        self._flat = manifest["args"] == {"tuple": [{"leaf": {"input": k}} for k in range(n)]}
        self._passed: set = set()

    def _scope(self) -> contextlib.AbstractContextManager:
        # a program holding int64 values beyond int32 was exported (and runs) in 64-bit mode
        return jax.enable_x64(True) if self.x64 else contextlib.nullcontext()

    def __call__(self, *args: Any, key: Any = None) -> Any:
        """The outputs, as `jm(*args)`. A train=True artifact takes `key` (a `jax.random.key`,
        its key data, or an int seed) for its random ops and returns `(outputs, updated)`:
        the new BatchNorm statistics by torch path, which it also keeps for its next call, as
        `jm(...)` updates `jm.module`."""
        with self._scope():
            if self._train is None:
                if key is not None:
                    raise CallError("this artifact was exported from an inference conversion; it takes no key",
                                    fix="call it without key=, or export a train=True conversion")
                return self._outputs(self._program(self._state, self._bind(args)))
            outs, new = self._program(self._state, self._bind(args), self._key(key))
            return self._outputs(outs), self._update(new)

    def _key(self, key: Any) -> Any:
        return key_data(self._train["key"], key)  # type: ignore[index]

    def _update(self, new: Any) -> dict[str, Any]:
        for where, value in zip(self._updated, new):
            for i in where:
                self._state[i] = value
        return dict(zip(self._train["updated"], new))  # type: ignore[index]

    def trace(self, *args: Any, key: Any = None) -> tuple[Any, list[Decision]]:
        """(outputs, decisions) as `JaxModel.trace` gives them, read from the traced program's log
        (a train=True artifact: given `key`, and its statistics are left as they are)."""
        with self._scope():
            if self._train is None:
                outs, (ids, values, margins, count) = self._trace(self._state, self._bind(args))
            else:
                (outs, _), (ids, values, margins, count) = self._trace(self._state, self._bind(args), self._key(key))
            outputs = self._outputs(outs)
        ids, values, margins, n = np.asarray(ids), np.asarray(values), np.asarray(margins), int(count)
        capacity = self.manifest["trace"]["capacity"]
        if n > capacity:
            raise DyclError(f"this call made {n} decisions; the artifact's trace holds at most {capacity}",
                            fix=f"export again with jm.export(path, trace_capacity={2 * n})")
        decisions = []
        for site_id, value, margin in zip(ids[:n], values[:n], margins[:n]):
            site, kind = self._sites[site_id]
            decisions.append(Decision(site, bool(value) if kind == "bool" else int(value), float(margin)))
        return outputs, decisions

    def _bind(self, args: tuple) -> list[Any]:
        if not self._flat:
            return self._checked(args)
        try:
            key = tuple([(type(a), a.shape, a.dtype) for a in args])
        except AttributeError:  # not arrays: the full check says what is wrong
            return self._checked(args)
        if key in self._passed:
            return list(args)
        tensors = self._checked(args)
        if all(t is a for t, a in zip(tensors, args)) and len(self._passed) < 64:
            self._passed.add(key)
        return tensors

    def _checked(self, args: tuple) -> list[Any]:
        given: dict[int, Any] = {}
        _match(self.manifest["args"], args, given, "arguments")
        specs = self.manifest["inputs"]
        sizes: dict[str, int] = {}
        return [_check(spec, given[k], sizes) for k, spec in enumerate(specs)]

    def _outputs(self, flat: Any) -> Any:
        return _build(self.manifest["outputs"], iter(flat))

    def __repr__(self) -> str:
        ins = ", ".join(f"{s['name']}: {s['dtype']}{s['shape']}" for s in self.manifest["inputs"])
        return f"LoadedModel(host={self.manifest['host']!r}, inputs=({ins}), platforms={self.manifest['platforms']})"


def _read(path: str, name: str) -> jax_export.Exported:
    with open(os.path.join(path, name), "rb") as f:
        return jax_export.deserialize(bytearray(f.read()))


def _kind(node: Any) -> tuple[str, Any]:
    return next((k, v) for k, v in node.items() if k not in ("where", "name", "fields"))


def _match(node: Any, value: Any, given: dict[int, Any], where: str) -> None:
    """Walk the argument structure of the conversion against `value`, collecting tensor inputs."""
    if "leaf" in node:
        leaf = node["leaf"]
        if "input" in leaf:
            given[leaf["input"]] = value
        elif "static" in leaf:
            if not (type(value).__name__ == leaf["type"] and value == leaf["static"]):
                raise CallError(f"{where} was baked in as {leaf['static']!r} at conversion; got {value!r}",
                                fix="non-tensor arguments are static: convert and export again with the new value")
        elif repr(value) != leaf["static_repr"]:
            raise CallError(f"{where} was baked in as {leaf['static_repr']} at conversion; got {value!r}",
                            fix="pass the same value as at conversion")
        return
    kind, kids = _kind(node)
    types = {"tuple": tuple, "list": list, "dict": dict, "namedtuple": tuple}
    if kind not in types or not isinstance(value, types[kind]):
        raise CallError(f"{where}: expected a {kind}, got {type(value).__name__}",
                        fix="call with the same argument structure as the conversion's example_args")
    if kind == "dict":
        if sorted(map(str, value)) != sorted(str(k) for k, _ in kids):
            raise CallError(f"{where}: expected keys {[k for k, _ in kids]}, got {list(value)}")
        for k, child in kids:
            _match(child, value[k], given, f"{where}[{k!r}]")
        return
    if len(value) != len(kids):
        raise CallError(f"{where}: expected {len(kids)} items, got {len(value)}",
                        fix="call with the same argument structure as the conversion's example_args")
    for i, (child, v) in enumerate(zip(kids, value)):
        _match(child, v, given, f"{where}[{i}]")


def _check(spec: dict, value: Any, sizes: dict[str, int]) -> Any:
    name = spec["name"]
    if type(value).__module__.startswith("torch"):  # a torch tensor, where torch is there: its numpy view
        value = value.detach().cpu().numpy()
    shape_text = "[" + ", ".join(map(str, spec["shape"])) + "]"
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        raise CallError(f"{name}: expected an array {spec['dtype']}{shape_text}, got {type(value).__name__}")
    shape = tuple(value.shape)
    ok = len(shape) == len(spec["shape"])
    for want, got in zip(spec["shape"], shape) if ok else ():
        if isinstance(want, str):  # a symbolic dimension: any size, the same wherever the symbol recurs
            ok = ok and sizes.setdefault(want, got) == got
        else:
            ok = ok and want == got
    got_dtype = np.dtype(value.dtype).name
    if not ok or got_dtype not in (spec["dtype"], spec["also_accepted"]):
        raise CallError(f"{name}: expected {spec['dtype']}{shape_text}, got {got_dtype}{list(shape)}",
                        fix="pass an array of the expected shape and dtype (cast with .astype if needed)")
    if got_dtype == spec["dtype"]:
        return value
    arr = np.asarray(value)
    if arr.dtype == np.int64 and arr.size and spec["dtype"] == "int32":
        lo, hi = int(arr.min()), int(arr.max())
        if lo < _INT32[0] or hi > _INT32[1]:
            raise CallError(f"{name}: value {lo if lo < _INT32[0] else hi} does not fit in int32, "
                            "as which this program holds int64")
    return arr.astype(spec["dtype"])


def trim(value: Any, lengths: Any) -> Any:
    """A padded output cut to its true shape `lengths`."""
    limits = tuple(int(n) for n in np.asarray(lengths))
    if limits == tuple(value.shape):  # nothing padded: the array itself, no program run
        return value
    if not isinstance(value, jax.Array):
        return value[tuple(slice(0, n) for n in limits)]
    cut = _CUTS.get(limits)
    if cut is None:
        cut = _CUTS[limits] = jax.jit(functools.partial(_cut, limits=limits))
    return cut(value)


def _cut(value: Any, limits: tuple[int, ...]) -> Any:
    return jax.lax.slice(value, (0,) * len(limits), limits)


# per true shape: a jitted cut. Eager indexing (`value[:n]`) parses the index and dispatches a
# slice in Python on every call (~60 µs, as long as a small model's program); a jitted call
# takes the C++ fast path. A decode loop's outputs have at most max_len shapes per rank.
_CUTS: dict[tuple[int, ...], Any] = {}


_NAMEDTUPLES: dict[tuple, type] = {}


def _build(node: Any, leaves: Iterator[Any]) -> Any:
    """The method's output structure from the flat outputs; padded leaves trimmed as `jm(...)` does."""
    if node == "*":
        return next(leaves)
    kind, kids = _kind(node)
    if kind == "dict":
        return {k: _build(c, leaves) for k, c in kids}
    parts = [_build(c, leaves) for c in kids]
    if kind == "tuple":
        return tuple(parts)
    if kind == "list":
        return parts
    if kind == "none":
        return None
    if kind == "namedtuple":
        key = (node["name"], tuple(node["fields"]))
        cls = _NAMEDTUPLES.setdefault(key, collections.namedtuple(*key))  # type: ignore[misc]
        return cls(*parts)
    if kind == "padded":
        return trim(*parts)
    if kind == "decoded":
        value, exceeded = parts
        if bool(np.any(np.asarray(exceeded))):
            raise decode_bound_error(node["where"])
        return value
    raise DyclError(f"the manifest names an output structure {kind!r} this dycl_jax does not know",
                    fix="load the artifact with the dycl_jax version that wrote it")
