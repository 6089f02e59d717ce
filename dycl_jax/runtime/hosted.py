"""Loads a dispatch-host artifact (`runtime/hosted_export.py`): runs its emitted host program,
whose region calls look up the exported program of their input signature (torch-free)."""
from __future__ import annotations

import contextlib
import math
import os
from typing import Any

import jax
import numpy as np
from jax import export as jax_export
from safetensors.flax import load_file

from dycl_jax.capture.ordered_dicts import keep_order
from dycl_jax.errors import CallError, Location
from dycl_jax.rewrite.appends import appending, kept_identity, kept_in_place, shared_containers
from dycl_jax.rewrite.decisions import Decision

HOST_MODULE, CONSTANTS = "host.py", "constants.safetensors"
# a part changing one list held under several names runs in torch on the live host: no program to export
SHARED_LIST_FIX = ("serve this model with the converted JaxModel in a Python process with torch (jm(...)), "
                   "whose host runs such a part in torch")
INT_LEAF = ["i"]  # a signature leaf a program takes as a symbolic int: any value in [0, int32 max]
_INT32_MAX = 2**31 - 1  # (lower/dtypes.INT32_MAX; that module imports torch)
# what a program's printed guard and computed ints may call (runtime/hosted_ints.py checks it)
INT_NAMESPACE = {"math": math, "min": min, "max": max, "abs": abs, "int": int, "float": float, "bool": bool,
                 "inf": math.inf}


def printed_int_fn(printed: list | None) -> Any:
    """A guard or computed int written as (argument names, expression), as a function; None for none."""
    if printed is None:
        return None
    args, body = printed
    return eval(f"lambda {', '.join(args)}: {body}", dict(INT_NAMESPACE))  # noqa: S307 (the artifact's own text)


class Undefined:
    """A variable not assigned yet on this path (as the rewrite's `Undefined`: using it fails)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise UnboundLocalError(f"local variable {self.name!r} referenced before assignment")

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return self._fail()

    __bool__ = __call__ = __iter__ = __len__ = __getitem__ = _fail


class _NotStaged:
    def __repr__(self) -> str:
        return "NOT_STAGED"


NOT_STAGED = _NotStaged()


class ModuleRef:
    """A torch module of the converted model as the host program sees it: its path, its plain
    Python attributes and submodules, and (ModuleList/Sequential) its items."""

    def __init__(self, path: str, table: dict, refs: dict, rt: "HostRuntime") -> None:
        self._path, self._table, self._refs, self._rt = path, table, refs, rt

    def _child(self, path: str) -> "ModuleRef":
        return self._refs.setdefault(path, ModuleRef(path, self._table, self._refs, self._rt))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """A submodule that is a dispatch host of its own, called from the host program."""
        fname = self._rt.manifest["methods"].get(self._path, {}).get("forward")
        if fname is None:
            raise CallError(f"the host program calls module {self._path or '(root)'}, which the artifact holds no "
                            "host program for", fix="export the model again with this version of dycl_jax")
        return self._rt.namespace[fname](self._rt, self, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        entry = self._table[self._path]
        if name in entry["children"]:
            return self._child(entry["children"][name])
        if name in entry["plain"]:
            return entry["plain"][name]
        raise AttributeError(f"module {self._path or '(root)'} has no attribute {name!r} in the artifact")

    def _items(self) -> list["ModuleRef"]:
        return [self._child(p) for p in self._table[self._path]["children"].values()]

    def __iter__(self) -> Any:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())

    def __getitem__(self, i: Any) -> Any:
        return self._items()[i]

    def __repr__(self) -> str:
        return f"<module {self._path or '(root)'}>"


class ShapeView:
    """An array as a statement that reads only its sizes sees it (`x.numel()`, `x.size(0)`, `x.shape`)."""

    def __init__(self, a: Any) -> None:
        self.shape = tuple(a.shape)
        self.ndim = len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return self.ndim


def _leaf_key(v: Any) -> list:
    """The JSON form of a signature leaf (as hosted_export.py writes it)."""
    if isinstance(v, (jax.Array, np.ndarray)):
        return ["a", list(v.shape), np.dtype(v.dtype).name]
    if isinstance(v, ModuleRef):
        return ["m", v._path]
    if isinstance(v, Undefined):
        return ["u", v.name]
    if type(v) is float:
        return ["f", v.hex()]
    if isinstance(v, np.generic):
        return ["g", v.dtype.name, v.item()]
    if type(v) is range:
        return ["r", v.start, v.stop, v.step]
    return ["p", type(v).__name__, v]


def _host_array(v: Any) -> Any:
    """A value a plain statement made: arrays as the dispatch host holds them (int64 -> int32)."""
    if isinstance(v, np.ndarray) and v.dtype in (np.int64, np.float64) and not jax.config.jax_enable_x64:
        return jax.numpy.asarray(v)
    return v


class HostRuntime:
    """What the emitted host program calls (`rt`): regions, islands, decisions."""

    Undefined = Undefined
    NOT_STAGED = NOT_STAGED

    def __init__(self, path: str, manifest: dict, state: list, namespace: dict, capacity: int):
        self.manifest, self.state, self.namespace, self.capacity = manifest, state, namespace, capacity
        self.constants = load_file(os.path.join(path, CONSTANTS))
        self.refs: dict[str, ModuleRef] = {}
        self.root = ModuleRef("", manifest["modules"], self.refs, self)
        self.refs[""] = self.root
        self.regions = manifest["regions"]
        self.programs: dict[str, Any] = {}
        self.index: list[list[dict]] = []  # per region part index: signature -> entry
        self.path = path
        self.decisions: list[Decision] | None = None
        self.margins: dict[int, tuple[Any, float]] = {}
        # train=True: the call's key data and how many keyed region programs it has run
        self.key: Any = None
        self.count = 0
        self.numpy_fns = [[{self._entry_key(e["tree"], e["key"]): e["fn"] for e in p.get("numpy", ())}
                           for p in r.get("parts", ())] for r in self.regions]
        self.lookup = [[{self._entry_key(e["tree"], e["key"]): e for e in p["entries"]} for p in r.get("parts", ())]
                       for r in self.regions]
        # programs over symbolic ints: their guard and the ints the host computes, as functions
        self.int_fns = {e["name"]: (printed_int_fn(e["guard"]), [(pos, ls, printed_int_fn([a, b]), int if k == "int"
                                                                  else bool) for pos, ls, a, b, k in e["computed"]])
                        for r in self.regions for p in r.get("parts", ()) for e in p["entries"] if "ints" in e}

    @staticmethod
    def _entry_key(tree: str, key: list) -> str:
        return repr((tree, key))

    def _program(self, name: str) -> Any:
        prog = self.programs.get(name)
        if prog is None:
            with open(os.path.join(self.path, name), "rb") as f:
                prog = self.programs[name] = jax_export.deserialize(bytearray(f.read()))
        return prog

    # ------------------------------------------------------------ what the host program calls

    def region(self, rid: int, vals: tuple) -> tuple:
        r = self._ran(rid)
        env = dict(zip(r["ins"], vals))
        for k, part in enumerate(r["parts"]):
            vals = tuple(env[n] for n in part["ins"])
            if part.get("shared_on_host") and shared_containers(vals):
                self._shared_refused(r, part, vals)
            if part.get("appends"):  # lists it only appends to go in empty, as on the live host
                outs = appending(part["ins"], part["outs"], part["appends"], vals,
                                 lambda fresh, k=k, part=part: self._part(rid, k, part, fresh))
            else:
                outs = self._part(rid, k, part, vals)
            # lists and dicts changed in place, or held under several names, stay one object (as on the live host)
            if part.get("in_place"):
                outs = kept_in_place(vals, outs, part["in_place"])
            if part.get("same"):
                outs = kept_identity(vals, outs, part["same"])
            env.update(zip(part["outs"], outs))
        return tuple(env[n] for n in r["outs"])

    @staticmethod
    def _shared_refused(r: dict, part: dict, vals: tuple) -> None:
        """A part that changes a list given to it under several names: a program takes each name
        as its own list, so the change would miss the other names; the live host runs it in torch."""
        names = sorted({part["ins"][i] for pair in shared_containers(vals) for i in pair})
        raise CallError(f"the {r['label']} changes a list or dict that this call gives it under several names "
                        f"({', '.join(f'`{n}`' for n in names)}); the dispatch host runs such a part in torch, so "
                        "the artifact cannot serve it", location=Location(r["file"], r["line"], ""),
                        fix=SHARED_LIST_FIX)

    def island(self, rid: int, vals: tuple) -> Any:
        r = self._ran(rid)
        part = r["parts"][0]
        if part["failed"]:
            return NOT_STAGED
        try:
            return self._part(rid, 0, part, vals)
        except CallError:
            if part.get("fallback"):  # an island that ran its host version too: it serves other values
                return NOT_STAGED
            raise

    @staticmethod
    def chunked() -> Any:
        """A loop the live host ran in chunks of iterations: its host loop runs here (the live host
        ran that loop once per path it took, so the loop's regions are in the artifact)."""
        return NOT_STAGED

    def decide(self, value: Any, label: str) -> bool:
        taken = bool(value)
        if self.decisions is not None:
            self.decisions.append(Decision(label, taken, self.margins.get(id(value), (None, math.nan))[1]))
        return taken

    @staticmethod
    def defined(value: Any) -> Any:
        if isinstance(value, Undefined):
            value._fail()
        return value

    # ------------------------------------------------------------ parts

    def _ran(self, rid: int) -> dict:
        r = self.regions[rid]
        if not r["ran"]:
            raise CallError(f"this input reaches the {r['label']}, which the dispatch host had not run when the model "
                            "was exported, so the artifact holds no program for it",
                            location=Location(r["file"], r["line"], ""),
                            fix="before jm.export, call jm on inputs that take every path (and every input shape)")
        return r

    def _part(self, rid: int, k: int, part: dict, vals: tuple) -> tuple:
        # dicts in their own key order, as the live host keyed and flattened them (capture/ordered_dicts.py)
        leaves, tree = jax.tree_util.tree_flatten(keep_order((vals, None)))
        entry = self.lookup[rid][k].get(self._entry_key(str(tree), [_leaf_key(v) for v in leaves]))
        if entry is not None:
            return self._run(entry, leaves)[0]  # a region program gives (outputs, module attributes)
        entry = next((e for e in part["entries"] if self._symbolic_fits(e, str(tree), leaves)), None)
        if entry is not None:  # a program with symbolic sizes or symbolic ints
            return self._run(entry, leaves)[0]
        for e in part["entries"]:  # a list of same-shaped arrays, stacked (runtime/hosted_lists.py)
            if "stack" in e and (stacked := _stack(vals, e["stack"])) is not None:
                leaves2, tree2 = jax.tree_util.tree_flatten(keep_order((stacked, None)))
                if _fits(e, str(tree2), leaves2):
                    return self._run(e, leaves2)[0]
        if "sizes" in part:  # statements computing Python values from sizes only
            env = dict(zip(part["ins"], jax.tree_util.tree_map(
                lambda v: ShapeView(v) if isinstance(v, (jax.Array, np.ndarray)) else v, vals)))
            for name, ins, outs in part["sizes"]:
                env.update(zip(outs, self.namespace[name](*[env[n] for n in ins])))
            return tuple(env[n] for n in part["outs"])
        fn = self.numpy_fns[rid][k].get(self._entry_key(str(tree), [_leaf_key(v) for v in leaves]))
        if fn is not None:  # a host statement with data-dependent shapes, as numpy code for this signature
            arrays = [v for v in leaves if isinstance(v, (jax.Array, np.ndarray))]
            return tuple(jax.numpy.asarray(o) for o in self.namespace[fn](*arrays))
        if "python" in part and (part["entries"] == [] or not any(isinstance(v, (jax.Array, np.ndarray))
                                                                    for v in leaves)):
            env = dict(zip(part["ins"], vals))
            for name, ins, outs in part["python"]:
                env.update(zip(outs, map(_host_array, self.namespace[name](*[env[n] for n in ins]))))
            return tuple(env[n] for n in part["outs"])
        r = self.regions[rid]
        shapes = ", ".join(f"{np.dtype(v.dtype).name}{list(v.shape)}" for v in leaves
                           if isinstance(v, (jax.Array, np.ndarray)))
        raise CallError(f"the {r['label']} was exported for the input signatures the dispatch host ran before export; "
                        f"this call gives it new ones ({shapes or 'new Python values'})",
                        location=Location(r["file"], r["line"], ""),
                        fix="before jm.export, call jm on inputs that reach these shapes and values")

    def _symbolic_fits(self, e: dict, tree: str, leaves: list) -> bool:
        """Whether a program with symbolic sizes and/or symbolic ints takes these leaves: sizes in
        range, each int in [0, int32 max], and its guard (torch.export's, e.g. an index's bounds) holds."""
        if "ranges" in e:
            fits = _fits(e, tree, leaves)
        elif "ints" in e:
            fits = self._ints_fit(e, tree, leaves)
        else:
            return False
        if not fits or "ints" not in e:
            return fits
        guard = self.int_fns[e["name"]][0]
        return guard is None or bool(guard(leaves))

    def _ints_fit(self, e: dict, tree: str, leaves: list) -> bool:
        """Whether a program over symbolic ints takes these leaves: the other leaves as keyed, each
        int in [0, int32 max] (its guard is checked apart)."""
        if e["tree"] != tree or len(e["key"]) != len(leaves):
            return False
        for want, v in zip(e["key"], leaves):
            if want == INT_LEAF:
                if type(v) is not int or not 0 <= v <= _INT32_MAX:
                    return False
            elif want != _leaf_key(v):
                return False
        return True

    def _updated(self, updates: list[int] | None, outs: Any) -> Any:
        """A train-mode program's outputs less the buffer updates before them, which go into the
        state every later region reads (as torch's BatchNorm updates its statistics in place)."""
        if not updates:
            return outs
        for i, value in zip(updates, outs):
            self.state[i] = value
        return outs[len(updates):]

    def _run(self, e: dict, leaves: list) -> Any:
        if e.get("mutated") and _aliased(leaves):
            raise CallError("this call passes one array under several names to a program that updates its inputs "
                            "in place; the exported program would update only one of them",
                            fix="keep this model in Python with torch (jm(...)), or pass distinct arrays")
        inputs = [self.state[v] if kind == "s" else self.constants[v] for kind, v in e["sources"]]
        tensors = [leaves[i] for i in e["tensors"]]
        updates = e.get("updates")
        extra: tuple = ()
        if updates is not None:  # train mode: the region call's key, as the live host's `Updating` draws it
            extra = (self.key, np.int32(self.count))
            self.count += 1
        scope = jax.enable_x64(True) if e["x64"] else contextlib.nullcontext()
        with scope:
            if self.decisions is not None and e["traced"]:
                outs, margins, (ids, values, ms, count) = self._program(e["name"] + ".trace.stablehlo").call(
                    inputs, tensors, *extra)
                outs, margins = self._updated(updates, outs), margins[len(updates or ()):]
                n = int(count)
                for site_id, value, margin in zip(np.asarray(ids)[:n], np.asarray(values)[:n], np.asarray(ms)[:n]):
                    site, kind = e["trace_sites"][site_id]
                    self.decisions.append(Decision(site, bool(value) if kind == "bool" else int(value), float(margin)))
                for o, m in zip(outs, margins):
                    if not math.isnan(float(m)):
                        self.margins[id(o)] = (o, float(m))
            else:
                outs = self._updated(updates, self._program(e["name"] + ".stablehlo").call(inputs, tensors, *extra))
        flat = [outs[s] if s is not None else _constant(c, self) for s, c in zip(e["slots"], e["constants"])]
        if e["passed"] is not None:
            flat = [leaves[p] if p is not None else v for p, v in zip(e["passed"], flat)]
        for position, ls, fn, kind in self.int_fns[e["name"]][1] if "ints" in e else ():
            flat[position] = kind(fn(*[leaves[i] for i in ls]))  # `t + 1` of the ints the program took
        return _build(e["out_tree"], flat)


def _stack(vals: tuple, n: int) -> tuple | None:
    """`vals` with input `n`, a list of arrays of one shape and dtype, as one stacked array."""
    items = vals[n]
    if type(items) is not list or not items or not all(isinstance(v, (jax.Array, np.ndarray)) for v in items) \
            or len({(tuple(v.shape), np.dtype(v.dtype)) for v in items}) != 1:
        return None
    return vals[:n] + (jax.numpy.stack(items),) + vals[n + 1:]


def _aliased(leaves: list) -> bool:
    arrays = [id(v) for v in leaves if isinstance(v, (jax.Array, np.ndarray))]
    return len(set(arrays)) != len(arrays)


def _fits(e: dict, tree: str, leaves: list) -> bool:
    """Whether a symbolic entry takes these leaves: the same tree and values, sizes within range."""
    if e["tree"] != tree or len(e["key"]) != len(leaves):
        return False
    bound: dict[str, int] = {}
    for want, v in zip(e["key"], leaves):
        if want == INT_LEAF:  # a symbolic int as well (its guard is checked apart)
            if type(v) is not int or not 0 <= v <= _INT32_MAX:
                return False
            continue
        got = _leaf_key(v)
        if want[0] != "a" or got[0] != "a":
            if want != got:
                return False
            continue
        if want[2] != got[2] or len(want[1]) != len(got[1]):
            return False
        for w, size in zip(want[1], got[1]):
            if isinstance(w, str):
                lo, hi = e["ranges"].get(w, [0, None])
                if bound.setdefault(w, size) != size or size < lo or (hi is not None and size > hi):
                    return False
            elif w != size:
                return False
    return True


def _constant(c: list, rt: HostRuntime) -> Any:
    kind = c[0]
    if kind == "m":
        return rt.refs.get(c[1]) or rt.root._child(c[1])
    if kind == "u":
        return Undefined(c[1])
    if kind == "f":
        return float.fromhex(c[1])
    if kind == "g":
        return np.dtype(c[1]).type(c[2])
    if kind == "r":
        return range(*c[1:])
    return c[2]


def _build(node: Any, flat: list) -> Any:
    if type(node) is int:
        return flat[node]
    (kind, kids), = node.items()
    if kind == "n":
        return None
    if kind == "t":
        return tuple(_build(c, flat) for c in kids)
    if kind == "l":
        return [_build(c, flat) for c in kids]
    return {k: _build(c, flat) for k, c in kids}


class HostedModel:
    """A deployed dispatch-host model: `m(*args)` as `jm(*args)`, `m.trace(*args)` as `jm.trace`."""

    def __init__(self, path: str, manifest: dict):
        self.manifest = manifest
        params = load_file(os.path.join(path, "params.safetensors"))
        state = [params[p] for p in manifest["state"]]
        with open(os.path.join(path, HOST_MODULE)) as f:
            text = f.read()
        namespace: dict[str, Any] = {"rt": HostRuntime}  # statement functions read rt.Undefined
        exec(compile(text, os.path.join(path, HOST_MODULE), "exec"), namespace)
        self._entry = namespace[manifest["entry"]]
        self._rt = HostRuntime(path, manifest, state, namespace, manifest["trace"]["capacity"])

    def __call__(self, *args: Any, key: Any = None) -> Any:
        """The outputs, as `jm(*args)`. A train=True artifact takes `key` (a `jax.random.key`, its
        data or an int seed) and returns `(outputs, updated)`, the BatchNorm statistics by torch
        path, which it also keeps for its next call (as loaded.LoadedModel does)."""
        train = self.manifest.get("train")
        if train is None:
            if key is not None:
                raise CallError("this artifact was exported from an inference conversion; it takes no key",
                                fix="call it without key=, or export a train=True conversion")
            return self._entry(self._rt, self._rt.root, *self._bind(args))
        outs, state = self._train_call(args, key)
        self._rt.state = state
        index = {p: i for i, p in enumerate(self.manifest["state"])}
        return outs, {p: state[index[p]] for p in train["updated"]}

    def trace(self, *args: Any, key: Any = None) -> tuple[Any, list[Decision]]:
        """(outputs, decisions): each host decision and each decision inside a region, in order
        (a train=True artifact: given `key`, and its statistics are left as they are)."""
        self._rt.decisions, self._rt.margins = [], {}
        try:
            if self.manifest.get("train") is not None:
                outs, _ = self._train_call(args, key)
            else:
                outs = self._entry(self._rt, self._rt.root, *self._bind(args))
            return outs, self._rt.decisions
        finally:
            self._rt.decisions, self._rt.margins = None, {}

    def _train_call(self, args: tuple, key: Any) -> tuple[Any, list]:
        """A train-mode call on a copy of the state: (outputs, the state after it)."""
        from dycl_jax.runtime.loaded import key_data  # loaded.py imports this module on use
        rt = self._rt
        data, kept = key_data(self.manifest["train"]["key"], key), rt.state
        rt.state, rt.key, rt.count = list(kept), data, 0
        try:
            return self._entry(rt, rt.root, *self._bind(args)), rt.state
        finally:
            rt.state, rt.key = kept, None

    def _bind(self, args: tuple) -> list[Any]:
        from dycl_jax.runtime.loaded import _check, _match  # loaded.py imports this module on use
        given: dict[int, Any] = {}
        _match(self.manifest["args"], args, given, "arguments")
        return [_check(spec, given[k], {}) for k, spec in enumerate(self.manifest["inputs"])]

    def __repr__(self) -> str:
        ins = ", ".join(f"{s['name']}: {s['dtype']}" for s in self.manifest["inputs"])
        return f"HostedModel(host='dispatch', inputs=({ins}))"
