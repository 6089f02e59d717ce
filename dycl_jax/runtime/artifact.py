"""`JaxModel.export`: a directory with the serialized StableHLO programs, the parameters in
safetensors and a JSON manifest, loadable without torch by `runtime/loaded.py`."""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
import torch
import torch.utils._pytree as pytree
from jax import export as jax_export

from dycl_jax import __version__
from dycl_jax.errors import DyclError, raised_by_us
from dycl_jax.lower.decision_log import DecisionLog
from dycl_jax.lower.dtypes import to_jax_dtype
from dycl_jax.lower.int_ranges import int_scope
from dycl_jax.lower.ops.control_flow import recording
from dycl_jax.rewrite.padding import Decoded, Padded
from dycl_jax.runtime.loaded import FORMAT, MANIFEST, PARAMS, PROGRAM, TRACE, save_params

if TYPE_CHECKING:
    from dycl_jax.runtime.model import JaxModel

PLATFORMS = ("cpu", "cuda")


def write_artifact(jm: "JaxModel", path: str, trace_capacity: int = 4096, strict: bool = False) -> dict:
    """Write `jm` as a deployable directory at `path`; returns the manifest."""
    if type(trace_capacity) is not int or trace_capacity < 1:
        raise DyclError(f"trace_capacity must be a positive int, got {trace_capacity!r}")
    if jm.host != "staged":  # the host program and its regions (runtime/hosted_export.py)
        from dycl_jax.runtime.hosted_export import write_hosted
        return write_hosted(jm, path, trace_capacity, strict)
    updated = getattr(jm, "updated_paths", None)  # a train=True model (runtime/training.py)
    fn, extra, train = jm._fn, [], None
    if updated is not None:
        fn, extra, train = _keyed(jm._fn, updated)
    with int_scope(jm.x64):
        state = [jax.ShapeDtypeStruct(np.shape(v), v.dtype) for v in jm._state_values()]
        program, batch = _export_batched(jm, fn, state, extra)
        log = DecisionLog(trace_capacity)

        def traced(s: list, t: list, *key: Any) -> tuple:
            log.start()
            with recording(log):
                outs = fn(s, t, *key)
            return outs, log.log

        trace = _export(traced, state, _input_avals(jm, {int(k): v for k, v in batch["symbols"].items()}), extra)
        n_in = len(jm.signature.inputs)
        inputs = [_input_spec(spec, aval) for spec, aval in
                  zip(jm.signature.inputs, trace.in_avals[len(state):len(state) + n_in])]
    manifest = {
        "format": FORMAT,
        "host": jm.host,
        "x64": jm.x64,
        "platforms": [p for p in program.platforms if p in trace.platforms],
        "batch": batch,
        "inputs": inputs,
        "args": _args_json(jm.signature.in_spec, jm.signature.arg_leaves, jm.signature.tensor_leaf_index),
        "outputs": _tree_json(jm.signature.out_spec),
        "output_avals": [_aval_json(a) for a in program.out_avals],
        "state": jm.state_paths,
        # train=True: the programs take a key's data last and return (outputs, updated statistics)
        "train": train,
        # every data-dependent site the rewrite found, and (site, value kind) by id in the trace's log
        "decision_sites": [site for fn in (jm._report.rewritten if jm._report else []) for site in fn.dynamic_sites],
        "trace": {"capacity": trace_capacity, "sites": [list(s) for s in log.sites]},
        "source": jm.source,
        "versions": {"jax": jax.__version__, "torch": torch.__version__, "dycl_jax": __version__},
    }
    # written only once everything is known: a refused model leaves no partial artifact
    os.makedirs(path, exist_ok=True)
    for name, exp in ((PROGRAM, program), (TRACE, trace)):
        with open(os.path.join(path, name), "wb") as f:
            f.write(exp.serialize())
    save_params(os.path.join(path, PARAMS), jm.state_paths, jm._state_values())
    with open(os.path.join(path, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def _export(fn: Any, state: list, inputs: list, extra: list | tuple = ()) -> jax_export.Exported:
    """Export for CPU and CUDA where both lower; else for this machine's platform (JAX refuses
    some lowerings for a platform whose plugin is not installed; the manifest lists platforms).
    `extra`: avals of further arguments after the inputs (a train=True program's key data)."""
    try:
        return jax_export.export(jax.jit(fn), platforms=PLATFORMS)(state, inputs, *extra)
    except Exception:  # noqa: BLE001 - retried for this machine's platform; a real failure raises again
        return jax_export.export(jax.jit(fn))(state, inputs, *extra)


def _keyed(fn: Any, updated: list[str]) -> tuple[Any, list, dict]:
    """A train=True program taking its key as raw key data (a typed key is not a serializable
    argument; any further arguments follow it), the aval of that data, and the manifest's
    `train` record."""
    sample = jax.random.key(0)
    data = jax.random.key_data(sample)
    impl = str(jax.random.key_impl(sample))

    def keyed(s: list, t: list, key_data: Any, *rest: Any) -> tuple:
        return fn(s, t, jax.random.wrap_key_data(key_data, impl=impl), *rest)

    record = {"updated": list(updated), "key": {"shape": list(data.shape), "dtype": np.dtype(data.dtype).name,
                                                "impl": impl}}
    return keyed, [jax.ShapeDtypeStruct(data.shape, data.dtype)], record


def _export_batched(jm: "JaxModel", fn: Any, state: list, extra: list | tuple = ()) -> tuple[jax_export.Exported, dict]:
    """The plain program, with dimension 0 symbolic on every input the signature leaves dynamic:
    one symbol per input first, one shared symbol if the program ties them, else fixed."""
    dynamic = [i for i, s in enumerate(jm.signature.inputs) if s.shape and s.shape[0] is None]
    if not dynamic:
        return _export(fn, state, _input_avals(jm, {}), extra), {"dim0": "fixed", "symbols": {},
                                                                   "reason": "no input has a dynamic dimension 0"}
    errors = []
    for shared in (False, True):
        symbols = {i: "b" if shared else f"b{k}" for k, i in enumerate(dynamic)}
        try:
            exp = _export(fn, state, _input_avals(jm, symbols), extra)
            return exp, {"dim0": "symbolic", "symbols": {str(i): s for i, s in symbols.items()}}
        except Exception as exc:  # noqa: BLE001 - a symbolic shape the program cannot take: next option
            if raised_by_us(exc):
                raise  # our own bug: it must surface, not become a fixed batch
            errors.append(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    exp = _export(fn, state, _input_avals(jm, {}), extra)
    return exp, {"dim0": "fixed", "symbols": {}, "reason": "; ".join(errors)}


def _input_avals(jm: "JaxModel", symbols: dict[int, str]) -> list[jax.ShapeDtypeStruct]:
    """Input avals at the example's shapes, dimension 0 replaced by its symbol where given."""
    names = sorted(set(symbols.values()))
    dims = dict(zip(names, jax_export.symbolic_shape(",".join(names)))) if names else {}
    sig = jm.signature
    out = []
    for i, spec in enumerate(sig.inputs):
        shape: list[Any] = list(sig.arg_leaves[sig.tensor_leaf_index[i]].shape)
        if i in symbols:
            shape[0] = dims[symbols[i]]
        out.append(jax.ShapeDtypeStruct(tuple(shape), to_jax_dtype(spec.dtype)))
    return out


def _aval_json(aval: Any) -> dict:
    return {"shape": [d if isinstance(d, int) else str(d) for d in aval.shape], "dtype": np.dtype(aval.dtype).name}


def _input_spec(spec: Any, aval: Any) -> dict:
    also = {torch.int64: "int64", torch.float64: "float64"}.get(spec.dtype)
    return {"name": spec.name, **_aval_json(aval), "torch_dtype": str(spec.dtype).replace("torch.", ""),
            "also_accepted": also}


def _tree_json(spec: pytree.TreeSpec) -> Any:
    """A torch pytree structure as JSON data that loaded.py rebuilds without torch."""
    if spec.is_leaf():
        return "*"
    kids = [_tree_json(c) for c in spec.children()]
    t = spec.type
    if t is tuple or t is list:
        return {t.__name__: kids}
    if t is dict:
        return {"dict": [[k, c] for k, c in zip(spec.context, kids)]}
    if t is type(None):
        return {"none": []}
    if t is Padded:
        return {"padded": kids}
    if t is Decoded:
        return {"decoded": kids, "where": list(spec.context)}
    if isinstance(spec.context, type) and issubclass(spec.context, tuple) and hasattr(spec.context, "_fields"):
        return {"namedtuple": kids, "name": spec.context.__name__, "fields": list(spec.context._fields)}
    raise DyclError(f"the method returns a {getattr(t, '__name__', t)}, which an artifact cannot describe",
                    fix="return tuples, lists, dicts or namedtuples of tensors")


def _args_json(spec: pytree.TreeSpec, leaves: list, tensor_index: list[int]) -> Any:
    """The argument structure with each leaf either an input index or its baked-in value."""
    positions = {leaf: k for k, leaf in enumerate(tensor_index)}
    marks = []
    for i, leaf in enumerate(leaves):
        if i in positions:
            marks.append({"input": positions[i]})
        elif leaf is None or isinstance(leaf, (bool, int, float, str)):
            marks.append({"static": leaf, "type": type(leaf).__name__})
        else:
            marks.append({"static_repr": repr(leaf)})
    it = iter(marks)

    def fill(node: Any) -> Any:
        if node == "*":
            return {"leaf": next(it)}
        key, kids = next((k, v) for k, v in node.items() if k not in ("where", "name", "fields"))
        if key == "dict":
            return {**node, "dict": [[k, fill(c)] for k, c in kids]}
        return {**node, key: [fill(c) for c in kids]}

    return fill(_tree_json(spec))
