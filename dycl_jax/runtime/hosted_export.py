"""`jm.export` of a dispatch-host model: the host program as torch-free Python (emit/host_program.py),
every compiled region signature the host has run as serialized StableHLO (plain and
decision-traced; symbolic sizes and ints where they hold, hosted_symbolic.py / hosted_ints.py),
plain-Python statements as code, and a manifest `runtime/hosted.py` loads; what the artifact
cannot serve for unseen inputs is warned about (or refused, `strict`) at export."""
from __future__ import annotations

import functools
import json
import math
import os
import warnings
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from safetensors.flax import save_file

from dycl_jax import __version__
from dycl_jax.emit.host_ops import numpy_statement
from dycl_jax.emit.host_program import SHAPE_READS, HostProgram, host_program, plain_statement
from dycl_jax.errors import DyclError, ExportCoverageWarning, Location
from dycl_jax.host.dispatch import CARRIED, DIRECT, EAGER, Compiled, DispatchHost, Part, tracks_views
from dycl_jax.lower.decision_log import DecisionLog
from dycl_jax.lower.dtypes import to_jax_dtype
from dycl_jax.lower.int_ranges import int_scope
from dycl_jax.lower.ops.control_flow import recording
from dycl_jax.host import values
from dycl_jax.host.training import RegionKeys, Updating
from dycl_jax.rewrite.modes import exclusive
from dycl_jax.rewrite.plan import Undefined
from dycl_jax.runtime import hosted_ints as ints
from dycl_jax.runtime.hosted import SHARED_LIST_FIX
from dycl_jax.runtime import hosted_lists as lists
from dycl_jax.runtime import hosted_symbolic as symbolic
from dycl_jax.runtime.artifact import _export, _keyed
from dycl_jax.runtime.loaded import HOSTED_FORMAT, MANIFEST, PARAMS, save_params

if TYPE_CHECKING:
    from dycl_jax.runtime.model import JaxModel

HOST_MODULE, CONSTANTS = "host.py", "constants.safetensors"
_ITEM_OPS = {"_local_scalar_dense.default"}  # what `.item()` / `.tolist()` run on the host


class _Writer:
    def __init__(self, jm: "JaxModel", host: DispatchHost, program: HostProgram, capacity: int, strict: bool):
        self.jm, self.host, self.program, self.capacity, self.strict = jm, host, program, capacity, strict
        # train=True: region programs take the call's key data and the region call's number and
        # return their buffer updates first (host/training.py); the manifest's `train` record
        self.train: dict | None = None
        self.key_extra: list = []
        if host.train:
            _, key_aval, self.train = _keyed(lambda *a: a, list(getattr(jm, "updated_paths", ())))
            self.key_extra = key_aval + [jax.ShapeDtypeStruct((), np.int32)]
        self.modules = {id(m): p for p, m in host.root.named_modules()}
        self.state = jm._state_values()
        self.files: dict[str, bytes] = {}
        self.constants: dict[str, Any] = {}
        self.const_ids: dict[int, str] = {}
        self.statements: set[str] = set()
        self.numpy_code: list[str] = []
        self.by_id = {id(m): m for _, m in host.root.named_modules()}
        self.uncovered: list[DyclError] = []  # what the artifact cannot serve for unseen inputs (warned)
        self.widened: set[int] = set()  # static programs export added at int values no guard took
        # (function, variable) of region inputs whose sizes changed between signatures (check_coverage)
        self.varying = symbolic.varying_inputs(host, program)

    def note_uncovered(self, problem: DyclError) -> None:
        """What the artifact will not serve for inputs unlike those run before export: a warning
        once written, or (strict) the refusal now."""
        if self.strict:
            raise DyclError(f"{problem.message} (strict=True refuses such an artifact)", location=problem.location,
                            fix=f"{problem.fix}; or export with strict=False (then a warning per such site)")
        self.uncovered.append(problem)

    # ------------------------------------------------------------ values

    def leaf_key(self, key: Any, where: Location) -> list:
        """A signature leaf (host/values.leaf_key) as JSON the loaded host recomputes."""
        if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], tuple):
            return ["a", list(key[0]), np.dtype(key[1]).name]
        kind, value = key
        if kind == "id" and value in self.modules:
            return ["m", self.modules[value]]
        if kind is Undefined:
            return ["u", value]
        if kind is float:
            return ["f", value]
        if kind in (bool, int, str) or kind is type(None):
            return ["p", kind.__name__, value]
        if isinstance(kind, type) and issubclass(kind, np.generic):
            return ["g", np.dtype(kind).name, value]
        if kind is range:
            return ["r", value.start, value.stop, value.step]
        raise DyclError(f"a region of the host program takes a {getattr(kind, '__name__', kind)} value, which an "
                        "exported host cannot key its programs on", location=where,
                        fix="pass tensors, Python numbers or strings between the host program's statements")

    def constant(self, value: Any, where: Location) -> list:
        """A Python value a region returns for its signature, as JSON."""
        if isinstance(value, torch.nn.Module) and id(value) in self.modules:
            return ["m", self.modules[id(value)]]
        if isinstance(value, Undefined):
            return ["u", value.name]
        if isinstance(value, float):
            return ["f", value.hex()]
        if value is None or type(value) in (bool, int, str):
            return ["p", type(value).__name__, value]
        if isinstance(value, np.generic):
            return ["g", value.dtype.name, value.item()]
        if type(value) is range:
            return ["r", value.start, value.stop, value.step]
        raise DyclError(f"a region of the host program returns a {type(value).__name__}, which an exported host "
                        "cannot hold", location=where, fix="return tensors or Python numbers from the statement")

    def array_constant(self, value: Any) -> str:
        name = self.const_ids.get(id(value))
        if name is None:
            name = self.const_ids[id(value)] = f"c{len(self.constants)}"
            self.constants[name] = jnp.asarray(value)
        return name

    # ------------------------------------------------------------ regions

    def region(self, rid: int) -> dict:
        spec = self.program.regions[rid]
        out: dict[str, Any] = {"label": spec.label, "file": spec.file, "line": spec.line, "kind": spec.kind,
                               "ins": list(spec.ins), "outs": list(spec.outs)}
        st = self.host.regions.get(id(spec))
        if st is None:  # a path not run before export: warned here, and the loaded host says so if it gets there
            self.note_uncovered(DyclError(
                f"{os.path.basename(spec.file)}:{spec.line}: the {spec.label} never ran before export, so the "
                "artifact holds no program for it; an input that reaches it gets a CallError when the artifact is "
                "called", location=Location(spec.file, spec.line, ""),
                fix="before jm.export, call jm on inputs that take this path"))
            return {**out, "ran": False}
        return {**out, "ran": True, "parts": [self.part(spec, rid, k, p) for k, p in enumerate(st.parts)]}

    def part(self, spec: Any, rid: int, k: int, part: Part) -> dict:
        first = spec.statements[part.first]
        where = Location(spec.file, first.line, first.code)
        out: dict[str, Any] = {"first": part.first, "stop": part.stop, "ins": list(part.ins), "outs": list(part.outs),
                               "failed": spec.kind == "island" and part.staged_nowhere(),
                               # its host version also ran (new int values: host/specialised.py; the
                               # dense form over its budget)
                               "fallback": spec.kind == "island" and part.falls_back(), "entries": []}
        if part.appends:  # lists it only appends to: taken empty, extended by the host (rewrite/appends.py)
            out["appends"] = list(part.appends)
        # one list or dict under several names, kept one object as on the live host (rewrite/appends.py)
        if part.in_place:
            out["in_place"] = [list(p) for p in part.in_place]
        if part.same:
            out["same"] = [list(p) for p in part.same]
        if part.in_place or part.changes:  # given one list under two names, the live host runs it in torch
            out["shared_on_host"] = True
        if tracks_views(part):
            raise DyclError(
                f"{os.path.basename(spec.file)}:{first.line}: the {spec.label} makes a view of a tensor that a later "
                "region updates in place; the dispatch host rebuilds the view after that update, an exported host "
                "does not yet", location=where,
                fix="keep this model in Python with torch (jm(...)); models that stage whole export with host=\"staged\"")
        kinds = set(type(e) if isinstance(e, Compiled) else e for e in part.cache.values())
        on_host = EAGER in kinds or (spec.kind == "region" and part.host_reason is not None)
        fname = self.program.region_fn[rid]
        if on_host and part.in_torch is None and not set(part.jax_ops) <= _ITEM_OPS:
            out["numpy"] = self.numpy_part(spec, rid, k, part, fname, where)
        elif on_host or kinds & {DIRECT, CARRIED}:  # (carried: statements that only move arrays)
            why = part.in_torch if on_host and part.in_torch else None
            why = why or plain_statement(spec, part.first, part.stop, self.program, fname, on_host)
            if why is not None:
                _refuse_on_host(spec, part, why)
            sts = [(self.program.statement_name(fname, s.fn), s) for s in spec.statements[part.first:part.stop]]
            self.statements.update(n for n, _ in sts)
            out["python"] = [[n, list(s.ins), list(s.outs)] for n, s in sts]
        compiled = [e for e in part.cache.values() if isinstance(e, Compiled)]
        if compiled and not on_host and all(s is None for e in compiled for s in e.slots) \
                and all(p is None for e in compiled for p in (e.passed or ())) \
                and plain_statement(spec, part.first, part.stop, self.program, fname, True, SHAPE_READS) is None:
            # Python values from sizes only (`sel.numel() == 0`): the statements, run on sizes, serve any shape
            sts = [(self.program.statement_name(fname, s.fn), s) for s in spec.statements[part.first:part.stop]]
            self.statements.update(n for n, _ in sts)
            out["sizes"] = [[n, list(s.ins), list(s.outs)] for n, s in sts]
        served: set[int] = set()  # signatures a symbolic program takes
        # (train mode: every program per signature, each captured in training mode as the host ran it)
        widen = part.variants and not self.host.train
        out["symbolic"], deferred = ints.widen(self, spec, part, fname) if widen else ([], [])
        made: list[tuple] = []  # (group, shapes, ranges) of each program with symbolic sizes
        for group in symbolic.groups(part) if not self.host.train else ():
            result = self.symbolic(spec, rid, k, part, fname, group, len(out["entries"]), where)
            if isinstance(result, str):
                out["symbolic"].append(f"{len(group)} signatures kept apart: {result}")
                continue
            entries, shapes, ranges = result
            out["entries"] += entries
            index = group[0][2].tensor_leaves
            fit: dict[int, bool] = {}  # (a program over symbolic ints is left out once every signature it served fits)
            for _, l, e in group:
                fit[id(e)] = fit.get(id(e), True) and symbolic.fits(shapes, l, index, ranges)
            served |= {i for i, ok in fit.items() if ok}
            made.append((group, shapes, ranges))
            out["symbolic"].append(f"{len(group)} signatures as one program, symbols {ranges}")
        out["symbolic"] += ints.resolve_deferred(self, spec, part, fname, deferred,
                                                 lambda key: any(symbolic.takes(*m, key) for m in made))
        for n_list, group in lists.groups(part) if not self.host.train else ():  # stacked, of symbolic length
            made = self.stacked(spec, rid, k, part, fname, n_list, group, out, where)
            if isinstance(made, str):
                out["symbolic"].append(f"{len(group)} signatures of a growing list kept apart: {made}")
                continue
            shapes, ranges, index = made
            served |= {id(g[4]) for g in group if symbolic.fits(shapes, g[3], index, ranges)}
            out["symbolic"].append(f"{len(group)} signatures with the list `{part.ins[n_list]}` stacked as one "
                                   f"program, symbols {ranges}")
        for key, entry in list(part.cache.items()):
            if key[0] == "variant":  # a program over symbolic ints (unless one with symbolic sizes took it)
                if id(entry) not in served:
                    self.variant(spec, rid, k, part, fname, entry, out, where)
                continue
            tree, leaves, grad, same = key
            if same and isinstance(entry, Compiled) and entry.mutated:
                _refuse_aliased(spec, part)
            if isinstance(entry, Compiled) and grad and id(entry) not in served:
                out["entries"].append(self.entry(rid, k, len(out["entries"]), tree, leaves, entry, where))
                if id(entry) in self.widened:
                    out["entries"][-1]["widened"] = True
        out["covers"] = [ints.describe(e["key"]) + (f" (sizes {e['ranges']})" if "ranges" in e else "")
                         for e in out["entries"]] + [ints.describe(e["key"]) for e in out.get("numpy", ())]
        if spec.kind == "region" and not part.cache:
            # every call the live host made gave it one list under two names, which it ran in torch
            self.note_uncovered(DyclError(
                f"{os.path.basename(spec.file)}:{first.line}: the {spec.label} took one list or dict under several "
                "names on every call before export, which the dispatch host runs in torch, so the artifact holds no "
                "program for it; an input that reaches it gets a CallError when the artifact is called",
                location=where, fix=SHARED_LIST_FIX))
        self.check_coverage(spec, part, out, fname)
        return out

    def variant(self, spec: Any, rid: int, k: int, part: Part, fname: str, entry: Compiled, out: dict,
                where: Location) -> None:
        """A program over symbolic ints as one exported program taking them as scalars, else (its
        guard or computed ints have no torch-free form) one static program per signature it served."""
        served = [key for key in part.served.get(id(entry), ()) if key[2]]
        if not served:
            return
        if served[0][3] and entry.mutated:
            _refuse_aliased(spec, part)
        fields = ints.int_fields(entry, served) if not self.host.train else "train mode exports each signature"
        if isinstance(fields, dict):
            tree, leaves, _, _ = served[0]
            keys = ints.int_keys([self.leaf_key(key, where) for key in leaves], entry)
            out["entries"].append({**self.entry(rid, k, len(out["entries"]), tree, leaves, entry, where, keys),
                                   **fields})
            return
        out["symbolic"].append(f"{len(served)} signatures over Python ints kept apart: {fields}")
        for tree, leaves, _, same in served:
            static = self.static_entry(spec, part, fname, tree, leaves, same)
            out["entries"].append(self.entry(rid, k, len(out["entries"]), tree, leaves, static, where))

    def stacked(self, spec: Any, rid: int, k: int, part: Part, fname: str, n_list: int, group: list, out: dict,
                where: Location) -> tuple | str:
        """One entry with the list input `n_list` stacked (hosted_lists.py), plus one at length 1
        (torch specialises it), or why not; the entries are added to `out`."""
        made: list = []
        for length in (None, 1):
            result = lists.stacked_program(self.host, spec, part, self.units(spec, fname), n_list, group,
                                           self.example, self.state, length)
            if isinstance(result, str):
                if length is None:
                    return result
                continue  # (a length the statements cannot take: not served, as before)
            plain, (traced_fn, state_avals, sym_avals), ranges, shapes, sources, tree2, keys2, index, passed = result
            keys = [self.leaf_key(key, where) for key in keys2]
            for shape, i in zip(shapes, index):
                keys[i] = ["a", shape, keys[i][2]]
            entry = group[0][4]
            e = self.exported(f"r{rid}p{k}e{len(out['entries'])}", tree2, keys, sources, entry, plain, traced_fn,
                              state_avals, sym_avals, where, ranges)
            out["entries"].append({**e, "tensors": index, "passed": passed, "stack": n_list,
                                   **({"widened": True} if length else {})})
            made.append((shapes, ranges, index))
        return made[0]

    def check_coverage(self, spec: Any, part: Part, out: dict, fname: str) -> None:
        """Note a part whose programs are per signature while its signature changed with the input
        before export (shapes or Python values), or while it ran at one size of a variable whose
        sizes changed elsewhere in its function: other inputs may give signatures it lacks."""
        fixed = [e for e in out["entries"] + list(out.get("numpy", ())) if not {"ranges", "widened"} & set(e)]
        # programs that differ only in dtypes (an int32 buffer becoming int64 after the first step) are
        # not a signature that changes with the input
        forms = {(e["tree"], json.dumps([k[:2] if k[0] == "a" else k for k in e["key"]])) for e in fixed}
        first = spec.statements[part.first]
        if len(forms) == 1 and not any("ranges" in e or "ints" in e for e in out["entries"]):
            grown = [n for n in part.ins if (fname, n) in self.varying]
            if grown:
                self.note_uncovered(DyclError(
                    f"{os.path.basename(spec.file)}:{first.line}: the {spec.label} ran at one input signature before "
                    f"export ({ints.describe(fixed[0]['key'])}), while `{grown[0]}` took several sizes elsewhere in "
                    "this function, so the artifact serves it only at that one; an input that gives it another size "
                    "gets a CallError when the artifact is called", location=Location(spec.file, first.line, first.code),
                    fix=f"before jm.export, call jm on inputs that give `{grown[0]}` other sizes here (e.g. other "
                        "decode lengths)"))
        if len(forms) < 2:
            return
        shown = "; ".join(ints.describe(e["key"]) for e in fixed[:3]) + ("; ..." if len(fixed) > 3 else "")
        self.note_uncovered(DyclError(
            f"{os.path.basename(spec.file)}:{first.line}: the {spec.label} ran with {len(fixed)} input signatures "
            f"before export ({shown}) and is exported as one program per signature, so the artifact serves only "
            "those; an input that gives it another one gets a CallError when the artifact is called",
            location=Location(spec.file, first.line, first.code),
            fix="before jm.export, call jm on inputs that reach every shape and Python value this statement takes "
                "(e.g. every decode length), or pass a tensor instead of a Python list or int that changes per call"))

    def static_entry(self, spec: Any, part: Part, fname: str, tree: Any, leaves: tuple, same: tuple,
                     symbolic: frozenset[int] = frozenset()) -> Compiled:
        """The part captured again at one signature: its Python ints constants, less `symbolic`."""
        args = [self.example(key) for key in leaves]
        # arrays as the live host holds them (numpy in the key's dtype: an int64 one keeps the program 64-bit)
        jleaves = [np.zeros(key[0], key[1]) if isinstance(v, torch.Tensor) else v for key, v in zip(leaves, args)]
        torch_args = tuple(jax.tree_util.tree_unflatten(tree, args))
        # the capture runs the program once (in train mode drawing a key and updating a copy of the state)
        previous, self.host._state = self.host._state, list(self.state) if self.host.train else self.state
        keys, self.host._keys = self.host._keys, RegionKeys(jax.random.key(0)) if self.host.train else None
        try:
            entry, _, _ = exclusive(self.host._capture)(spec, part, self.units(spec, fname), jleaves, tree,
                                                         torch_args, symbolic, same)
        finally:
            self.host._state, self.host._keys = previous, keys
        return entry

    def symbolic(self, spec: Any, rid: int, k: int, part: Part, fname: str, group: list, n: int,
                 where: Location) -> tuple[list[dict], list, dict] | str:
        """One entry with symbolic sizes for `group` (hosted_symbolic.py), or why not."""
        fns = self.units(spec, fname)
        result = symbolic.symbolic_program(self.host, spec, part, fns, group, self.example, self.state)
        if isinstance(result, str):
            return result
        plain, (traced_fn, state_avals, sym_avals), ranges, shapes, sources, found = result
        tree, leaves, entry = group[0]
        keys = [self.leaf_key(key, where) for key in leaves]
        for shape, i in zip(shapes, entry.tensor_leaves):
            keys[i] = ints.INT_LEAF if shape is None else ["a", shape, keys[i][2]]
        fields = ints.int_fields(found, [(t, l, None, None) for t, l, _ in group]) if entry.symbolic else {}
        if isinstance(fields, str):
            return fields
        made = [{**self.exported(f"r{rid}p{k}e{n}", tree, keys, sources, entry, plain, traced_fn, state_avals,
                                 sym_avals, where, ranges), **fields}]
        for m, (small, plain1, traced1, avals1, tensors1, sources1) in enumerate(symbolic.small_sizes(
                self.host, spec, part, fns, group, self.example, self.state, shapes, ranges)):
            made.append({**self.exported(f"r{rid}p{k}e{n}s{m}", tree, [self.leaf_key(key, where) for key in small],
                                         sources1, entry, plain1, traced1, avals1, tensors1, where),
                         "widened": True})  # sizes the symbolic program leaves out
        return made, shapes, ranges

    def exported(self, name: str, tree: Any, keys: list, sources: list, entry: Compiled, plain: Any,
                 traced_fn: Any, state_avals: list, tensor_avals: list, where: Location,
                 ranges: dict | None = None) -> dict:
        """The manifest entry of a program exported here (its files written with it)."""
        self.files[f"{name}.stablehlo"] = plain.serialize()
        sites: list = []
        if traced_fn is not None:
            with int_scope(entry.x64):
                traced, sites = self._traced(traced_fn, state_avals, tensor_avals, entry)
            self.files[f"{name}.trace.stablehlo"] = traced.serialize()
        out = {"name": name, "tree": str(tree), "key": keys,
               "sources": [["s", v] if s else ["c", self.array_constant(v)] for s, v in sources],
               "tensors": entry.tensor_leaves, "out_tree": _tree_json(entry.out_tree, len(entry.slots)),
               "slots": entry.slots, "constants": [None if s is not None else self.constant(c, where)
                                                   for s, c in zip(entry.slots, entry.constants)],
               "passed": entry.passed, "x64": entry.x64, "traced": traced_fn is not None,
               "mutated": bool(entry.mutated), "trace_sites": [list(s) for s in sites]}
        if isinstance(entry.fn, Updating):  # the state entries its first outputs update
            out["updates"] = list(entry.fn.targets)
        return {**out, "ranges": ranges} if ranges is not None else out

    def units(self, spec: Any, fname: str) -> list:
        """The region's statement functions, compiled from the rewrite's code (torch code)."""
        return self.program.units(spec, fname)

    def numpy_part(self, spec: Any, rid: int, k: int, part: Part, fname: str, where: Location) -> list[dict]:
        """A host statement computing data-dependent shapes: numpy code per signature (emit/host_ops.py)."""
        units = list(zip(self.units(spec, fname)[part.first:part.stop], spec.statements[part.first:part.stop]))
        out = []
        for n, (tree, leaves, grad, _same) in enumerate(part.cache):
            values = [self.example(key) for key in leaves]
            index = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]

            def run(*tensors: torch.Tensor, values: list = values, index: list = index, tree: Any = tree) -> tuple:
                filled = list(values)
                for i, t in zip(index, tensors):
                    filled[i] = t
                vals, _ = jax.tree_util.tree_unflatten(tree, filled)
                env = dict(zip(part.ins, vals))
                for fn, st in units:
                    env.update(zip(st.outs, fn(*[env[x] for x in st.ins])))
                outs = tuple(env[x] for x in part.outs)
                if not all(isinstance(o, torch.Tensor) for o in outs):
                    raise TypeError("a Python value out of a tensor statement")
                return outs

            name = f"{fname}__r{rid}p{k}k{n}"
            text, why = numpy_statement(run, [values[i] for i in index], name)
            if text is None:
                _refuse_on_host(spec, part, why)
            self.numpy_code.append(text)
            out.append({"tree": str(tree), "key": [self.leaf_key(key, where) for key in leaves], "fn": name})
        return out

    def example(self, key: Any) -> Any:
        """A placeholder value of a signature leaf: zeros for an array (as torch holds it), else the value."""
        return values.placeholder(key, self.by_id)

    def entry(self, rid: int, k: int, n: int, tree: Any, leaves: tuple, entry: Compiled, where: Location,
              keys: list | None = None) -> dict:
        """One compiled signature as it is (`keys`: its JSON key, symbolic int leaves as INT_LEAF)."""
        keys = keys or [self.leaf_key(key, where) for key in leaves]
        state_avals = [jax.ShapeDtypeStruct(np.shape(self.state[v] if s else v), (self.state[v] if s else v).dtype)
                       for s, v in entry.sources]
        tensor_avals = ints.tensor_avals(keys, entry)
        with int_scope(entry.x64):  # the plain functions: never a trace cached under a recorder
            plain_fn = self._program_fn(entry.fn)
            plain = _export(plain_fn, state_avals, tensor_avals, self.key_extra if plain_fn is not entry.fn else ())
        traced = self._program_fn(entry.margins)
        return self.exported(f"r{rid}p{k}e{n}", tree, keys, entry.sources, entry, plain, traced, state_avals,
                             tensor_avals, where)

    def _program_fn(self, fn: Any) -> Any:
        """The pure function of a host program (its jitted form's, or in train mode its keyed one,
        which takes the key's data and the region call's number after the tensors)."""
        if isinstance(fn, Updating):
            keyed, _, _ = _keyed(fn.program.__wrapped__, [])
            return keyed
        return getattr(fn, "__wrapped__", fn)

    def _traced(self, fn: Any, state: list, tensors: list, entry: Compiled) -> tuple[Any, list]:
        log = DecisionLog(self.capacity)
        extra = self.key_extra if isinstance(entry.margins, Updating) else []

        def traced(s: list, t: list, *key: Any) -> tuple:
            log.start()
            with recording(log):
                outs, margins = fn(s, t, *key)
            ms = [jnp.float32(math.nan) if m is None else jnp.asarray(m, jnp.float32).reshape(()) for m in margins]
            return outs, ms, log.log

        return _export(traced, state, tensors, extra), log.sites


def _refuse_aliased(spec: Any, part: Part) -> None:
    first = spec.statements[part.first]
    raise DyclError(
        f"{os.path.basename(spec.file)}:{first.line}: the {spec.label} updates in place a tensor that has several "
        "names here, and an exported host does not keep those names one tensor",
        location=Location(spec.file, first.line, first.code),
        fix="keep this model in Python with torch (jm(...)), or update one name only")


def _refuse_on_host(spec: Any, part: Part, why: str) -> None:
    """Refuse a part that runs on the dispatch host in a form an exported host cannot run."""
    first = spec.statements[part.first]
    raise DyclError(
        f"{os.path.basename(spec.file)}:{first.line}: `{first.code.strip()}` runs on the dispatch host "
        f"({part.host_reason or 'plain Python'}), and an exported host cannot run it without torch: {why}",
        location=Location(spec.file, first.line, first.code),
        fix="write the statement with tensor operations torch.export captures, or keep this model in Python with "
            "torch (jm(...)); staged models export with host=\"staged\"")


def _tree_json(treedef: Any, n: int) -> Any:
    """A jax treedef of tuples, lists and dicts as JSON (leaves by index)."""
    def walk(node: Any) -> Any:
        if type(node) is int:
            return node
        if node is None:
            return {"n": 0}
        if type(node) is tuple:
            return {"t": [walk(c) for c in node]}
        if type(node) is list:
            return {"l": [walk(c) for c in node]}
        if type(node) is dict:
            return {"d": [[k, walk(c)] for k, c in node.items()]}
        raise DyclError(f"a region returns a {type(node).__name__}, which an exported host cannot rebuild",
                        fix="return tuples, lists or dicts of tensors from the host program's statements")
    return walk(jax.tree_util.tree_unflatten(treedef, list(range(n))))


def _module_attributes(root: torch.nn.Module) -> dict[str, dict]:
    """Per module path: its submodules, plain Python attributes, and whether it is a container."""
    out = {}
    for path, m in root.named_modules():
        plain = {k: v for k, v in vars(m).items() if not k.startswith("_")
                 and (v is None or type(v) in (bool, int, float, str)
                      or type(v) in (tuple, list) and all(type(x) in (bool, int, float, str) for x in v))}
        out[path] = {"children": {k: f"{path}.{k}" if path else k for k in m._modules},
                     "plain": plain, "sequence": isinstance(m, (torch.nn.ModuleList, torch.nn.Sequential))}
    return out


def write_hosted(jm: "JaxModel", path: str, trace_capacity: int, strict: bool = False) -> dict:
    """Write the dispatch-host model `jm` as an artifact directory; returns its manifest. What it
    cannot serve for inputs unlike those run before export is warned about (refused if `strict`)."""
    # (a train=True model calls the host's train_call, with the buffers it returns bound)
    host: DispatchHost = jm._fn.func.__self__ if isinstance(jm._fn, functools.partial) else jm._fn  # type: ignore
    if host.attrs.slots:
        raise DyclError("the host program's statements write module attributes (state kept on `self` between "
                        "statements), which an exported host does not hold", location=jm.dispatch_location,
                        fix="keep the values in local variables, or convert with host=\"staged\"")
    sig = jm.signature
    if sig.in_spec != torch.utils._pytree.tree_structure(tuple(range(len(sig.arg_leaves)))) \
            or len(sig.tensor_leaf_index) != len(sig.arg_leaves):
        raise DyclError("an exported dispatch host takes tensor arguments only, positionally",
                        location=jm.dispatch_location, fix="wrap the model so that its method takes only tensors")
    program = host_program(host.plan.dispatch, {id(m): p for p, m in host.root.named_modules()}, host.root,
                           host.method)
    writer = _Writer(jm, host, program, trace_capacity, strict)
    regions = [writer.region(rid) for rid in range(len(program.regions))]
    if writer.uncovered:  # one warning for the artifact: the first site in full, the others by file:line
        first, rest = writer.uncovered[0], writer.uncovered[1:]
        more = f"\n  and {len(rest)} more such site(s): " + ", ".join(
            f"{os.path.basename(p.location.file)}:{p.location.line}" for p in rest) if rest else ""
        warnings.warn(ExportCoverageWarning(f"{first}{more}\n  (the manifest's `coverage` lists them; "
                                            "jm.export(..., strict=True) refuses such an artifact)"), stacklevel=4)
    text = program.module_text(writer.statements) + "".join(f"\n\n{c}\n" for c in writer.numpy_code)
    if writer.numpy_code and "import numpy as np" not in text:
        text = text.replace("\n\n\n", "\nimport numpy as np\n\n\n", 1)
    inputs = [{"name": s.name, "shape": [f"{s.name}_{d}" for d in range(len(s.shape))],
               "dtype": np.dtype(to_jax_dtype(s.dtype)).name, "torch_dtype": str(s.dtype).replace("torch.", ""),
               "also_accepted": {torch.int64: "int64", torch.float64: "float64"}.get(s.dtype)} for s in sig.inputs]
    manifest = {
        "format": HOSTED_FORMAT, "host": "dispatch", "entry": program.entry, "methods": program.methods,
        "inputs": inputs,
        "args": {"tuple": [{"leaf": {"input": k}} for k in range(len(inputs))]},
        "regions": regions, "modules": _module_attributes(host.root), "state": jm.state_paths,
        "shapes": "a region's signatures that differ only in array sizes share one program with symbolic sizes "
                  "where torch.export and jax.export take them (each part's `symbolic` says); a program over "
                  "Python ints takes them as scalar inputs; the others are exported per signature the host ran "
                  "before export (`coverage` lists where that leaves inputs unserved)",
        "coverage": {"complete": not writer.uncovered,
                     "uncovered": [{"file": p.location.file, "line": p.location.line, "what": p.message,
                                    "fix": p.fix} for p in writer.uncovered],
                     "note": "each region part's `covers` lists the signatures its programs take: `int (any "
                             "value ...)` is a Python int taken as a scalar input, `sizes` are symbolic"},
        # train=True: each region program takes the call's key data and the region call's number
        # (counting, per call, the programs that have `updates`) and returns those updates first
        "train": writer.train,
        "source": jm.source, "trace": {"capacity": trace_capacity},
        "versions": {"jax": jax.__version__, "torch": torch.__version__, "dycl_jax": __version__},
    }
    os.makedirs(path, exist_ok=True)  # written only once everything is known: a refusal leaves nothing
    for name, blob in writer.files.items():
        with open(os.path.join(path, name), "wb") as f:
            f.write(blob)
    with open(os.path.join(path, HOST_MODULE), "w") as f:
        f.write(text)
    save_params(os.path.join(path, PARAMS), jm.state_paths, writer.state)
    save_file(writer.constants or {"_": jnp.zeros(())}, os.path.join(path, CONSTANTS))
    with open(os.path.join(path, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest
