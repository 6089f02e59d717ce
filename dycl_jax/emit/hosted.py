"""Emitted Flax source for a dispatch-host model: the host program (emit/host_program.py) as the
host modules' methods with its control flow in Python, each compiled region part as a jitted
method written from its graph, host statements inlined as Python or as numpy (emit/host_ops.py)."""
from __future__ import annotations

import ast
import copy
import os
import re
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
import torch

from dycl_jax.capture.region import capture_call
from dycl_jax.emit import hierarchy, hosted_train
from dycl_jax.emit.bodies import Body
from dycl_jax.emit.host_ops import numpy_statement
from dycl_jax.emit.host_program import (SHAPE_READS, HostProgram, _free_names, _globals_text, host_program,
                                        plain_statement)
from dycl_jax.emit.ops import Expr, lit
from dycl_jax.emit.program import Program
from dycl_jax.emit.writer import assemble, state_refs
from dycl_jax.errors import DyclError, Location
from dycl_jax.host import values
from dycl_jax.host.dispatch import CARRIED, DIRECT, EAGER, OVER_BUDGET, Compiled, DispatchHost, Part, tracks_views
from dycl_jax.rewrite.modes import exclusive
from dycl_jax.rewrite.plan import Undefined
from dycl_jax.source import origins

_ITEM_OPS = {"_local_scalar_dense.default"}  # `.item()` / `.tolist()`: plain Python on a JAX array
_COMMENT = "_dycl_comment"  # a marker statement, written as a comment line


class _Text(str):
    """Emitted code standing for a value inside a rebuilt output structure."""

    def __repr__(self) -> str:
        return str(self)


@dataclass
class _Graph:
    """One compiled part captured again at one signature, for writing."""

    rid: int
    k: int
    cap: Any
    leaf_text: list[str]
    modules: dict[str, str]  # module path -> the leaf text holding it
    kinds: dict[str, str]  # input name -> "array" (holds arrays), "module" or "python"
    lists: set[str]  # input names holding a list
    vals: list  # the example leaves it was captured with
    given: tuple  # the values of the part's inputs


@dataclass
class Hosted:
    """What the writer assembles: the graphs, each class's host and region methods, module-level code."""

    graphs: list[_Graph] = field(default_factory=list)
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    methods: dict[str, list[str]] = field(default_factory=dict)  # module path -> method texts
    calls: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)  # path -> __call__
    functions: list[str] = field(default_factory=list)  # module-level numpy statements
    globals: set[str] = field(default_factory=set)  # the user's module globals the host reads (imports, constants)


def _refuse(spec: Any, part: Part, why: str) -> DyclError:
    first = spec.statements[part.first]
    return DyclError(f"emitted source: `{first.code.strip()}` ({os.path.basename(spec.file)}:{first.line}) "
                     f"runs on the dispatch host and {why}", location=Location(spec.file, first.line, first.code),
                     fix="keep this model in Python with torch (jm(...)), or write the statement with tensor "
                         "operations torch.export captures")


class HostedEmitter:
    """Reads a dispatch host after the calls it has run and writes its program as Flax source."""

    def __init__(self, host: DispatchHost):
        if host.attrs.slots:
            raise DyclError("emitted source: the host program's statements write module attributes, which the "
                            "emitted module does not hold", fix="keep the values in local variables")
        self.host = host
        self.train = host.train  # train=True: regions captured in training mode, keyed (emit/hosted_train.py)
        self.modules = {id(m): p for p, m in host.root.named_modules()}
        self.by_id = {id(m): m for m in host.root.modules()}
        self.program: HostProgram = host_program(host.plan.dispatch, self.modules, host.root, host.method)
        self.paths = {f: p for p, ms in self.program.methods.items() for f in ms.values()}
        self.out = Hosted()
        self.emitted: set[str] = set()  # module-level names the emitted host calls
        self.lines_of: dict[tuple[int, int], list] = {}  # (region, part) -> (method, spec, part, module path)
        self.params: dict[tuple[int, int], list[str]] = {}  # (region, part) -> the method's parameters
        # parts returning Python values their graph computed from its sizes: served at those sizes only
        self.constant_outputs: set[tuple[int, int]] = set()
        # islands whose host version also ran: their version table gives None for other values
        self.fallback: set[tuple[int, int]] = set()
        self.tables: set[tuple[int, int]] = set()  # parts written as a table of versions
        self.ran: dict[str, bool] = {}  # per host function with regions: whether any of them ran

    # ------------------------------------------------------------ reading the host

    def signatures(self, part: Part) -> list[tuple[tuple, Any]]:
        """(signature, what the host holds for it) per signature the part ran (an island's
        signatures over the dense form's budget left out: its host version serves them)."""
        keys = []
        for key, entry in part.cache.items():
            if entry == OVER_BUDGET:
                continue
            if key[0] == "variant":  # a program over symbolic ints: the signatures it served, ints as constants
                keys += [(k, entry) for k in part.served.get(id(entry), ())]
            else:
                keys.append((key, entry))
        return keys

    # ------------------------------------------------------------ regions

    def region(self, rid: int, targets: str) -> list[str]:
        """The statements replacing `targets = rt.region(rid, ...)` in the host function."""
        spec = self.program.regions[rid]
        fname = self.program.region_fn[rid]
        st = self.host.regions.get(id(spec))
        self.ran[fname] = self.ran.get(fname, False) or st is not None
        if st is None:
            return [f"raise ValueError({f'the {spec.label} never ran before this module was emitted: emit it again after calling the converted model on an input that reaches it'!r})"]
        lines = []
        for k, part in enumerate(st.parts):
            lines += self.part(rid, k, spec, part, fname)
        names = targets.replace("(", "").replace(")", "").replace(" ", "").strip(",").split(",") if targets else []
        if names and names != list(spec.outs):  # the parts bind the region's outputs by name
            lines.append(f"{targets} = {', '.join(spec.outs)}{',' if len(spec.outs) == 1 else ''}")
        return lines

    def part(self, rid: int, k: int, spec: Any, part: Part, fname: str) -> list[str]:
        if tracks_views(part):
            raise _refuse(spec, part, "makes a view of a tensor that a later region updates in place, which the "
                                      "dispatch host rebuilds after the update and the emitted module does not yet")
        kinds = {type(e) if isinstance(e, Compiled) else e for e in part.cache.values()}
        on_host = EAGER in kinds or (spec.kind == "region" and part.host_reason is not None)
        if on_host and part.in_torch is not None:
            raise _refuse(spec, part, f"runs in torch ({part.in_torch})")
        if on_host and not set(part.jax_ops) <= _ITEM_OPS:
            return self.numpy_part(rid, k, spec, part, fname)
        compiled = [e for e in part.cache.values() if isinstance(e, Compiled)]
        sizes = compiled and all(s is None for e in compiled for s in e.slots) \
            and all(p is None for e in compiled for p in (e.passed or ())) \
            and plain_statement(spec, part.first, part.stop, self.program, fname, True, SHAPE_READS) is None
        # a graph that only forwards its inputs (`return outputs[best], best`): the statements themselves
        forwards = compiled and all(getattr(e.fn, "__qualname__", "").startswith("_passthrough") for e in compiled)
        if on_host or kinds and kinds <= {DIRECT, CARRIED} or sizes or forwards:  # (carried: statements that move arrays)
            why = plain_statement(spec, part.first, part.stop, self.program, fname, bool(on_host or sizes or forwards),
                                  SHAPE_READS | {"item", "tolist", "append", "extend"})
            if why is not None:
                raise _refuse(spec, part, f"the emitted module cannot run it without torch: {why}")
            # (the live host calls a program here, which takes a region key: the stream moves on alike)
            counted = self.train and compiled and not forwards
            return ([hosted_train.NEXT] if counted else []) + self.python_part(spec, part, fname)
        return self.compiled_part(rid, k, spec, part, fname)

    def python_part(self, spec: Any, part: Part, fname: str) -> list[str]:
        """The statements themselves, inlined: array sizes read as JAX arrays give them."""
        out = []
        for st in spec.statements[part.first:part.stop]:
            fn = copy.deepcopy(self.program.statements[HostProgram.statement_name(fname, st.fn)])
            body = [s for s in fn.body if not _undefined_check(s) and not isinstance(s, ast.Return)]
            out += [ast.unparse(_SizesAsJax().visit(s)) for s in body]
        return out

    def numpy_part(self, rid: int, k: int, spec: Any, part: Part, fname: str) -> list[str]:
        """A host statement with data-dependent shapes: numpy code per signature, chosen by its Python values."""
        units = list(zip(self.program.units(spec, fname)[part.first:part.stop],
                         spec.statements[part.first:part.stop]))
        texts: dict[str, list] = {}
        arrays_of: list[str] | None = None
        base = f"{_ident(spec)}_{k}" if k else _ident(spec)
        self.emitted.update({base, base.upper()})
        for (tree, leaves, _grad, _same), _ in self.signatures(part):
            vals = [values.placeholder(key, self.by_id) for key in leaves]
            index = [i for i, v in enumerate(vals) if isinstance(v, torch.Tensor)]

            def run(*tensors: torch.Tensor, vals: list = vals, index: list = index, tree: Any = tree) -> tuple:
                filled = list(vals)
                for i, t in zip(index, tensors):
                    filled[i] = t
                env = dict(zip(part.ins, jax.tree_util.tree_unflatten(tree, filled)[0]))
                for fn, st in units:
                    env.update(zip(st.outs, fn(*[env[x] for x in st.ins])))
                return tuple(env[x] for x in part.outs)

            text, why = numpy_statement(run, [vals[i] for i in index], base)
            if text is None:
                raise _refuse(spec, part, f"has no numpy form here: {why}")
            leaf_text = _leaf_texts(part.ins, tree, vals)
            arrays = [leaf_text[i] for i in index]
            if arrays_of not in (None, arrays):
                raise _refuse(spec, part, "takes its arrays in another structure at another call")
            arrays_of = arrays
            plain = tuple(leaf_text[i] for i, v in enumerate(vals) if not isinstance(v, (torch.Tensor, torch.nn.Module,
                                                                                          Undefined)))
            key = tuple(vals[i] for i, v in enumerate(vals) if not isinstance(v, (torch.Tensor, torch.nn.Module,
                                                                                  Undefined)))
            texts.setdefault(text, []).append((plain, key))
        where = f"# {os.path.basename(spec.file)}:{spec.statements[part.first].line}: " \
                f"`{spec.statements[part.first].code.strip()}` in numpy (its result's size depends on the values)"
        targets = ", ".join(part.outs) + ("," if len(part.outs) == 1 else "")
        if len(texts) == 1:
            self.out.functions.append(where + "\n" + next(iter(texts)))
            return [f"{targets} = {base}({', '.join(arrays_of or [])})"]
        table, plain_names = [], None
        for n, (text, uses) in enumerate(texts.items()):
            self.out.functions.append(where + "\n" + text.replace(f"def {base}(", f"def {base}_{n}(", 1))
            for plain, key in uses:
                plain_names = plain
                table.append(f"{key!r}: {base}_{n}")
        if not plain_names:
            raise _refuse(spec, part, "has several numpy forms that differ in array sizes only")
        self.out.functions.append(f"{base.upper()} = {{{', '.join(table)}}}  # by ({', '.join(plain_names)})")
        pick = f"({', '.join(plain_names)}{',' if len(plain_names) == 1 else ''})"
        return [f"{targets} = {base.upper()}[{pick}]({', '.join(arrays_of or [])})"]

    def compiled_part(self, rid: int, k: int, spec: Any, part: Part, fname: str) -> list[str]:
        """The graph of every signature it ran (static shapes); written once the program is known.
        A signature the host captured with static shapes and ints is written from the host's own
        capture; one its program serves with symbolic ints is captured again with them constant."""
        path = self.paths[fname]
        fns = None
        if not part.cache:  # every call ran it in torch (rewrite/appends.shared_containers): no graph to write
            raise _refuse(spec, part, "took one list or dict under several names on every call before emitting, "
                                      "which the dispatch host runs in torch; an emitted method would take each "
                                      "name as a list of its own")
        for (tree, leaves, _grad, same), entry in self.signatures(part):
            if same:
                raise _refuse(spec, part, "takes one tensor under two names, which the emitted method does not keep")
            vals = [values.placeholder(key, self.by_id) for key in leaves]
            torch_args = tuple(jax.tree_util.tree_unflatten(tree, vals))
            cap = entry.captured if isinstance(entry, Compiled) else None
            if cap is None:
                fns = fns or self.program.units(spec, fname)
                cap = exclusive(capture_call)(self.host.root, self.host._body(spec, part, fns), torch_args,
                                              self.host._capture_context, leaf_view=values.open_closures,
                                              train=self.train)
            leaf_text = _leaf_texts(part.ins, tree, vals)
            held = {self.modules[id(v)]: leaf_text[i] for i, v in enumerate(vals)
                    if isinstance(v, torch.nn.Module) and self.modules[id(v)] != path}
            given = torch_args[0]
            kinds = {n: "python" if _numbers(v) else "array" if isinstance(v, (torch.Tensor, list, tuple, dict)) else
                     "module" if isinstance(v, torch.nn.Module) else "python" for n, v in zip(part.ins, given)}
            lists = {n for n, v in zip(part.ins, given) if type(v) is list}
            self.out.graphs.append(_Graph(rid, k, cap, leaf_text, held, kinds, lists, vals, tuple(given)))
            for entry in cap.state:
                self.out.state.setdefault(entry.path, entry.tensor)
        name = f"_{_ident(spec)}" + (f"_{k}" if k else "")
        taken = {v[0] for key, v in self.lines_of.items() if key != (rid, k)}
        while name in taken:  # two regions on one line (an island's host version)
            name += "_"
        self.lines_of[(rid, k)] = [name, spec, part, path]
        targets, after = _kept_identities(spec, part, dict(zip(part.ins, given)))
        outs = ", ".join(targets) + ("," if len(targets) == 1 else "")
        return [f"{outs} = " + _call_marker(rid, k) if part.outs else _call_marker(rid, k)] + after

    # ------------------------------------------------------------ the host functions

    def host_functions(self) -> None:
        for fname, fn in self.program.functions.items():
            path = self.paths[fname]
            methods = [m for m, f in self.program.methods[path].items() if f == fname]
            fn = copy.deepcopy(fn)
            fn.args.posonlyargs = fn.args.posonlyargs[1:]  # `rt`
            body = self.statements(fn.body, self.program.generated[fname])
            owners = [self.host.root.get_submodule(p) for p, ms in self.program.methods.items() if fname in ms.values()]
            body = [_AttributeValues(owners, self.program.files[fname], self.program.generated[fname]).visit(s)
                    for s in body]
            fn.body = body or [ast.Pass()]
            names = {n for n in _free_names(fn) if not n.startswith("_dycl_") and n not in self.emitted}
            self.out.globals.update(_globals_text(names, self.program.namespaces[fname], self.program.files[fname],
                                                  fn.lineno))
            lines = _with_comments(ast.unparse(ast.Module(fn.body, []))).splitlines()
            params = [a.arg for a in fn.args.args][1:]
            for m in methods:
                if m == "forward" or (path == "" and m == self.host.method):
                    self.out.calls[path] = (params, lines)
                else:
                    self.out.methods.setdefault(path, []).append(
                        f"def {m}(self, {', '.join(params)}):\n" + "\n".join("    " + ln for ln in lines))

    def statements(self, body: list[ast.stmt], generated: str) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        skip = False
        for i, s in enumerate(body):
            if skip:
                skip = False
                continue
            call = s.value if isinstance(s, (ast.Assign, ast.Expr)) else None
            op = _rt_call(call)
            if op == "Undefined":
                continue
            if op == "region":
                targets = ast.unparse(s.targets[0]) if isinstance(s, ast.Assign) else ""
                out += [ast.parse(t).body[0] for t in self.region(call.args[0].value, targets)]
                continue
            if op == "chunked":  # a loop the live host runs in chunks (host/chunks.py): its host loop here
                skip = True
                out += self.statements(body[i + 1].body, generated)
                continue
            if op == "island":
                rid, then, other = call.args[0].value, body[i + 1].body, body[i + 1].orelse
                skip = True
                spec = self.program.regions[rid]
                st = self.host.regions.get(id(spec))
                if st is None or st.parts[0].staged_nowhere():
                    out += self.statements(then, generated)  # the island did not stage: its host version
                    continue
                if st.parts[0].over_budget is not None:
                    # its program (the dense form) calls the submodules' staged code, its host version
                    # their host code: one emitted class per module cannot be both
                    raise DyclError(
                        f"emitted source: the {spec.label} ran as one program at some input sizes and as its host "
                        f"version at larger ones ({st.parts[0].over_budget}); the emitted module holds one form "
                        "per submodule", location=spec.location,
                        fix="emit after calling the converted model only on inputs of one side of that budget, or "
                            "deploy with jm.export(...), whose artifact serves both")
                self.part(rid, 0, spec, st.parts[0], self.program.region_fn[rid])
                out += [ast.parse(f"{s.targets[0].id} = {_call_marker(rid, 0)}").body[0]]
                if st.parts[0].falls_back():  # its host version ran too (host/specialised.py, dense form's budget)
                    self.fallback.add((rid, 0))
                    out.append(ast.If(test=ast.parse(f"{s.targets[0].id} is None", mode="eval").body,
                                      body=self.statements(then, generated) or [ast.Pass()],
                                      orelse=self.statements(other, generated)))
                else:
                    out += self.statements(other, generated)
                continue
            s = _Operators().visit(s)
            if isinstance(s, (ast.If, ast.For, ast.While)):
                where = origins.resolve(generated, s.lineno)
                label = origins.site(generated, s.lineno)
                if where is not None:
                    text = f"{os.path.basename(where.file)}:{where.line}" + (f" ({label})" if label else "")
                    out.append(ast.Expr(ast.Call(ast.Name(_COMMENT, ast.Load()), [ast.Constant(text)], [])))
                s.body = self.statements(s.body, generated) or [ast.Pass()]
                s.orelse = self.statements(s.orelse, generated)
            out.append(s)
        return out

    # ------------------------------------------------------------ region methods, from their graphs

    def region_methods(self, prog: Program) -> None:
        texts: dict[tuple[int, int], dict[str, list]] = {}
        for g in self.out.graphs:
            name, spec, part, path = self.lines_of[(g.rid, g.k)]
            text = self.method_text(prog, g, name, spec, part, path)
            texts.setdefault((g.rid, g.k), {}).setdefault(text, []).append(g)
        for (rid, k), found in texts.items():
            name, spec, part, path = self.lines_of[(rid, k)]
            methods = self.out.methods.setdefault(path, [])
            python_in = any(g.kinds[n] == "python" for gs in found.values() for g in gs for n in part.ins)
            if len(found) == 1 and (rid, k) not in self.constant_outputs | self.fallback and not python_in:
                methods.append(next(iter(found)))
                continue
            # torch.export wrote the graph per input sizes (it specialises sizes 0 and 1) or per Python
            # value it baked in: one version each, chosen by the sizes of the arrays and those values
            g0 = next(iter(found.values()))[0]
            ins = [n for n in part.ins if n != "self"]
            keyed = [hosted_train.NEXT_PARAM] if self.train else []
            self.tables.add((rid, k))
            # (a list the part only appends to goes in empty on the host: not part of the key)
            arrays = [n for n in ins if g0.kinds[n] == "array" and n not in part.appends]
            plain = [n for n in ins if g0.kinds[n] == "python"]
            table = {}
            for i, (text, graphs) in enumerate(found.items()):
                methods.append(text.replace(f"def {name}(", f"def {name}_{i}(", 1))
                for g in graphs:
                    if [n for n in ins if g.kinds[n] == "array" and n not in part.appends] != arrays:
                        raise _refuse(spec, part, "takes arrays under other names at another call")
                    sizes = tuple(tuple(v.shape) for t, v in zip(g.leaf_text, g.vals)
                                  if isinstance(v, torch.Tensor) and t.split("[")[0] in arrays)
                    given = dict(zip(part.ins, g.given))
                    if any(type(given[n]) not in (int, float, bool, str, type(None)) and not _numbers(given[n])
                           for n in plain):
                        raise _refuse(spec, part, "takes a Python value that is not a number or string")
                    key = (sizes, tuple(tuple(given[n]) if _numbers(given[n]) else given[n] for n in plain))
                    if table.get(key, (f"{name}_{i}",))[0] != f"{name}_{i}":  # e.g. two module classes
                        raise _refuse(spec, part, "is written differently for inputs of the same sizes and values")
                    table[key] = (f"{name}_{i}", g.rid, g.k)
            versions = {key: v[0] for key, v in table.items()}
            missing = ["        return None  # its host version runs"] if (rid, k) in self.fallback else [
                f"        raise ValueError(f'{spec.label}: no version for {{key}}; this module serves only the (input "
                f"sizes, Python values) it ran with before it was emitted: {{list(versions)}}; emit it again after "
                f"calling the converted model on such inputs (e.g. other decode lengths)')"]
            methods.append("\n".join([
                f"# {spec.label}: one version per input sizes and Python values it ran with",
                f"def {name}(self{''.join(', ' + n for n in ins + keyed)}):",
                f"    key = tuple(a.shape for a in jax.tree.leaves(({''.join(n + ', ' for n in arrays)}))), "
                f"({''.join((f'tuple({n})' if _numbers(g0.given[part.ins.index(n)]) else n) + ', ' for n in plain)})",
                f"    versions = {versions!r}",
                "    version = versions.get(key)",
                "    if version is None:",
                *missing,
                f"    return getattr(self, version)({', '.join(ins + [k + '()' for k in keyed])})"]))
            self.params[(rid, k)] = ins

    def method_text(self, prog: Program, g: _Graph, name: str, spec: Any, part: Part, path: str) -> str:
        gm = g.cap.ep.graph_module
        user = state_refs(g.cap.ep)[1]
        prog.bound = g.modules
        body = Body(prog, path, gm, reserved=set(part.ins))
        for node, leaf in zip(user, g.cap.inputs):
            body.env[node] = Expr(g.leaf_text[leaf])
        items = hierarchy.build([n for n in gm.graph.nodes if n.op == "call_function"], path, prog.inline,
                                prog.classes)
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        try:
            exprs = body.run(items, list(out_node.args[0]))
        except DyclError as exc:  # a region node's stack is the rewrite's code: the part's line is the user's
            if exc.location is not None:
                raise
            first = spec.statements[part.first]
            raise DyclError(exc.message, location=Location(spec.file, first.line, first.code), fix=exc.fix) from None
        finally:
            prog.bound = {}
        # train mode: the buffers the region updates are its graph's first outputs, written into the module
        updates, exprs = exprs[:len(g.cap.mutations)], exprs[len(g.cap.mutations):]
        body.lines += [f"{prog.state_expr(m, path)} = {lit(e)}" for m, e in zip(g.cap.mutations, updates)]
        leaves, constants = [], False
        for j, (slot, const) in enumerate(zip(g.cap.slots, g.cap.constants)):
            passed = g.cap.passed[j] if g.cap.passed else None
            if passed is None and slot is None and not isinstance(const, (torch.nn.Module, Undefined)):
                self.constant_outputs.add((g.rid, g.k))
                constants = True
            leaves.append(_Text(g.leaf_text[passed] if passed is not None else
                                str(exprs[slot]) if slot is not None else repr(const)))
        outs = jax.tree_util.tree_unflatten(g.cap.out_tree, leaves)[0]
        ret = ", ".join(_appended(n, o, g) for n, o in zip(part.outs, outs)) + ("," if len(outs) == 1 else "")
        first, last = spec.statements[part.first], spec.statements[part.stop - 1]
        lines = f"{os.path.basename(spec.file)}:{first.line}" + (f"-{last.line}" if last.line != first.line else "")
        # Python values are baked into the graph: static (a version per value, chosen by the caller)
        params = [n for n in part.ins if n != "self"]
        static = tuple(n for n, v in zip(part.ins, g.given) if n != "self" and g.kinds[n] == "python"
                       and type(v) in (int, float, bool, str, type(None)))
        self.params[(g.rid, g.k)] = params
        deco = f"@nnx.jit(static_argnames={static!r})" if static else "@nnx.jit"
        # a jitted method returns arrays only: one giving Python values (sizes) runs its jnp code eagerly
        compute = any(n.op == "call_function" for n in gm.graph.nodes) and not constants
        keyed = [hosted_train.KEY] if self.train else []
        head = [f"# {spec.label}: lines {lines}"] + ([deco] if compute else []) + \
            [f"def {name}(self{''.join(', ' + n for n in params + keyed)}):"]
        code = hosted_train.keyed_body(body.lines, body.keyed) + [f"return {ret}" if ret else "return ()"]
        return "\n".join(head + ["    " + ln for ln in code])


def _appended(name: str, value: Any, g: _Graph) -> str:
    """An output list that is the input list of that name with items appended: `name + [new]`."""
    held = [t for t in g.leaf_text if re.fullmatch(rf"{name}\[\d+\]", t)]
    if type(value) is not list or name not in g.lists or [str(v) for v in value[:len(held)]] != held:
        return repr(value)
    rest = value[len(held):]
    return f"{name} + {rest!r}" if rest else name


def _kept_identities(spec: Any, part: Part, given: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The call's assignment targets and the statements after it that keep list identity as the
    live host does (`appends.kept_in_place`, `kept_identity`): a method returns new lists, so a
    list the part changes only in place is written into the caller's list (`outs[:] = ...`, seen
    by every name holding it), and an output that holds another output's object, or an input's
    (`saved = outs`), is bound to it again."""
    targets, after = list(part.outs), []
    for i, o in part.in_place:
        if type(given.get(part.ins[i])) is list:
            targets[o] = f"{part.outs[o]}[:]"
        elif type(given.get(part.ins[i])) is dict:
            targets[o] = f"_{part.outs[o]}_new"
            after += [f"{part.outs[o]}.clear()", f"{part.outs[o]}.update(_{part.outs[o]}_new)"]
    for o, from_input, i in part.same:
        if not from_input:
            after.append(f"{part.outs[o]} = {part.outs[i]}")
            continue
        src = part.ins[i]
        if any(j == i for j, _ in part.in_place):  # the caller's object gets the new contents already
            targets[o] = "_"
        elif src in part.outs or type(given.get(src)) not in (list, dict):
            raise _refuse(spec, part, f"gives back `{part.outs[o]}` as the caller's `{src}` changed, which the "
                                      "emitted method does not keep")
        else:
            targets[o] = f"{src}[:]" if type(given[src]) is list else f"_{src}_new"
            after += [] if type(given[src]) is list else [f"{src}.clear()", f"{src}.update(_{src}_new)"]
        after.append(f"{part.outs[o]} = {src}")
    return targets, after


def _numbers(v: Any) -> bool:
    """A non-empty list or tuple of Python ints (`decode_lengths = lengths.tolist()`): the graph bakes
    them in, like an int, so the method has a version per value (the list as a tuple in its key). (An
    empty list, or one of floats (`.item()` scores), may hold arrays at another call.)"""
    return type(v) in (list, tuple) and len(v) > 0 and all(type(x) is int for x in v)


def _call_marker(rid: int, k: int) -> str:
    return f"_dycl_call_{rid}_{k}()"  # the method's parameters are known once its graph is written


def _ident(spec: Any) -> str:
    return f"{os.path.splitext(os.path.basename(spec.file))[0]}_{spec.line}".replace("-", "_")


def _leaf_texts(ins: tuple[str, ...], tree: Any, vals: list) -> list[str]:
    """Per leaf of `((values of ins), attributes)`: the emitted expression reading it (`x`, `xs[1]`)."""
    structured = jax.tree_util.tree_unflatten(tree, vals)
    paths = jax.tree_util.tree_flatten_with_path(structured)[0]
    out = []
    for path, _ in paths:
        j = path[1].idx
        out.append(ins[j] + jax.tree_util.keystr(tuple(path[2:])))
    return out


def _undefined_check(s: ast.stmt) -> bool:
    return isinstance(s, ast.If) and "Undefined" in ast.unparse(s.test)


def _rt_call(node: Any) -> str | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
            and node.func.value.id == "rt":
        return node.func.attr
    return None


class _Operators(ast.NodeTransformer):
    """`rt.decide(v, site)` and `rt.defined(v)` are `v` in the emitted host."""

    def visit_Call(self, node: ast.Call) -> Any:
        self.generic_visit(node)
        return node.args[0] if _rt_call(node) in ("decide", "defined") else node


class _AttributeValues(ast.NodeTransformer):
    """`self.budget` read by host code, where it holds a Python number, string or None: that value,
    as the compiled regions hold the attributes they read (the emitted classes keep no such
    attributes). Instances of one class that hold different values cannot share the method: refused."""

    def __init__(self, owners: list[Any], file: str, generated: str):
        self.owners, self.file, self.generated = owners, file, generated

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        self.generic_visit(node)
        if not (isinstance(node.value, ast.Name) and node.value.id == "self" and isinstance(node.ctx, ast.Load)):
            return node
        found = [getattr(m, node.attr, _ABSENT) for m in self.owners]
        if not found or any(v is not None and type(v) not in (bool, int, float, str) for v in found):
            return node  # a submodule, a parameter (the emitted classes hold them), or not plain
        if any(v != found[0] or type(v) is not type(found[0]) for v in found):
            where = origins.resolve(self.generated, getattr(node, "lineno", 0)) or Location(self.file, 0, "")
            raise DyclError(f"the host code reads `self.{node.attr}`, which instances of one class hold with different "
                            f"values ({', '.join(sorted({repr(v) for v in found}))}); the emitted method is shared by "
                            "those instances and holds no per-instance Python attributes", location=where,
                            fix="keep this model in Python (jm(...)), or give the instances one value")
        return ast.copy_location(ast.Constant(found[0]), node)


_ABSENT = object()


class _SizesAsJax(ast.NodeTransformer):
    """torch's size reads as a JAX array has them: `x.numel()` -> `x.size`, `x.size(d)` -> `x.shape[d]`."""

    def visit_Call(self, node: ast.Call) -> Any:
        self.generic_visit(node)
        f = node.func
        if not isinstance(f, ast.Attribute) or node.keywords:
            return node
        if f.attr == "numel" and not node.args:
            return ast.Attribute(f.value, "size", ast.Load())
        if f.attr == "dim" and not node.args:
            return ast.Attribute(f.value, "ndim", ast.Load())
        if f.attr == "size":
            shape = ast.Attribute(f.value, "shape", ast.Load())
            return ast.Subscript(shape, node.args[0], ast.Load()) if node.args else shape
        return node


def _with_comments(text: str) -> str:
    lines = []
    for ln in text.splitlines():
        stripped = ln.lstrip()
        if stripped.startswith(_COMMENT + "("):
            ln = ln[: len(ln) - len(stripped)] + "# " + ast.literal_eval(stripped[len(_COMMENT) + 1:-1])
        lines.append(ln)
    return "\n".join(lines)


def emit_hosted(host: DispatchHost, model_name: str) -> tuple[str, dict[str, np.ndarray]]:
    """The emitted module of a dispatch-host model (the regions it has run so far) and its weights."""
    em = HostedEmitter(host)
    em.host_functions()
    refs: dict[Any, str] = {}
    for g in em.out.graphs:
        refs.update(state_refs(g.cap.ep)[0])
    classes = {p: type(m) for p, m in host.root.named_modules(remove_duplicate=False)}
    updated = tuple(dict.fromkeys(m for g in em.out.graphs for m in g.cap.mutations))
    prog = Program([g.cap.ep.graph_module for g in em.out.graphs], classes, em.out.state, refs, updated)
    em.region_methods(prog)
    root_call = em.out.calls[""]
    functions = em.out.functions
    if em.train:  # the root call takes key= and hands each compiled region call its key
        prog.keyed_calls.add("")
        root_call = hosted_train.keyed_root(*root_call)
        functions = [hosted_train.REGION_KEYS, *functions]
    unran = {em.paths[f] for f, ran in em.ran.items() if not ran}
    for path, call in em.out.calls.items():
        # a submodule whose host method never ran a region, but which a compiled graph calls (inside a
        # staged island): its __call__ is the graph's code, not a method that can only raise
        if path and not (path in unran and path in prog.bodies):
            prog.bodies[path] = call
    header = {"import numpy as np", "import jax", "import os"}
    globals_ = ["\n".join(sorted(em.out.globals - header))] if em.out.globals - header else []
    text, weights = assemble(prog, model_name, root_call, em.out.state, em.out.methods, globals_ + functions)

    def call(m: re.Match) -> str:
        key = (int(m.group(1)), int(m.group(2)))
        keyed = [] if not em.train else [hosted_train.NEXT_FN if key in em.tables else hosted_train.NEXT]
        return f"self.{em.lines_of[key][0]}({', '.join(em.params[key] + keyed)})"
    text = re.sub(r"_dycl_call_(\d+)_(\d+)\(\)", call, text)
    return re.sub(r"\b_dycl_(?=[a-z]+_\d)", "_", text), weights
