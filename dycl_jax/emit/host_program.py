"""The dispatch host's program as torch-free Python: the rewritten control-flow skeleton with
each region call naming its exported region, and the plain-Python statements it may run."""
from __future__ import annotations

import ast
import copy
import builtins
import linecache
import math
import random
import time
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dycl_jax.errors import DyclError, Location
from dycl_jax.rewrite.regions import RegionSpec

# the operators the skeleton calls, and what the loaded runtime (`rt`) calls them
_CALLS = {"region": "region", "island": "island", "chunked": "chunked", "decide": "decide", "defined": "defined"}
_NAMES = {"Undefined", "NOT_STAGED"}
# what a plain-Python statement may do to an array: read Python values out of it
_ARRAY_READS = {"item", "tolist", "shape", "append", "extend", "ndim"}
# modules the emitted host code may use as they are (a clock read, a Python draw: every call, as torch)
_MODULES = {np: "numpy", math: "math", time: "time", random: "random"}
# what a statement computing Python values from sizes only may read (runs on `ShapeView`s)
SHAPE_READS = {"shape", "numel", "size", "dim", "ndim"}


@dataclass
class HostProgram:
    """The emitted functions (one per dispatch-rewritten method), the regions they call by
    index, and the statement functions that may run as plain Python."""

    entry: str = ""
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)  # emitted name -> host function
    namespaces: dict[str, dict] = field(default_factory=dict)  # emitted name -> the user's module globals
    files: dict[str, str] = field(default_factory=dict)  # emitted name -> the user's file
    methods: dict[str, dict[str, str]] = field(default_factory=dict)  # module path -> method -> emitted name
    regions: list[RegionSpec] = field(default_factory=list)
    region_fn: list[str] = field(default_factory=list)  # per region: the emitted function calling it
    statements: dict[str, ast.FunctionDef] = field(default_factory=dict)  # emitted statement name -> its code
    islands: dict[str, ast.FunctionDef] = field(default_factory=dict)  # the same for staged islands' functions
    sites: dict[str, list] = field(default_factory=dict)  # emitted name -> the rewrite's site table
    generated: dict[str, str] = field(default_factory=dict)  # emitted name -> the rewrite's file (origin map key)

    @staticmethod
    def statement_name(fn: str, unit: str) -> str:
        return f"{fn}__{unit[len('_dycl_'):]}"

    def units(self, spec: RegionSpec, fname: str) -> list:
        """The region's statement functions, compiled from the rewrite's code (torch code run by the
        host and captured again at export and emission)."""
        from dycl_jax.rewrite import operators  # (the statements call `_dycl_ops`)
        namespace = {**self.namespaces[fname], "_dycl_ops": operators, "_dycl_sites": self.sites.get(fname, [])}
        for st in spec.statements:
            name = self.statement_name(fname, st.fn)
            node = self.statements.get(name) or self.islands[name]
            # an island's staged function, and the one a tail island's wrapper calls
            called = [self.islands[n] for n in (self.statement_name(fname, x.id) for x in ast.walk(node)
                                                 if isinstance(x, ast.Name) and x.id.startswith("_dycl_island_"))
                      if n in self.islands and n != name]
            tree = ast.Module([copy.deepcopy(x) for x in (*called, node)], [])
            exec(compile(tree, spec.file, "exec"), namespace)
        return [namespace[st.fn] for st in spec.statements]

    def module_text(self, used: set[str]) -> str:
        """The module: imports and constants it reads, the host functions, the statement functions in `used`."""
        lines = ['"""Host program of a converted model (dispatch host), emitted by dycl_jax: '
                 'control flow in Python, regions as exported programs."""']
        seen: dict[str, str] = {}
        for fname, fn in [*self.functions.items(), *((n.split("__")[0], self.statements[n]) for n in sorted(used))]:
            names = _free_names(fn) - {"_dycl_ops"} - set(self.functions)
            for line in _globals_text(names, self.namespaces[fname], self.files[fname], fn.lineno):
                if seen.setdefault(line.split(" ")[-1] if line.startswith("import") else line.split(" =")[0],
                                   line) != line:
                    raise DyclError(f"two converted methods read different module globals named like `{line}`",
                                    fix="give the globals distinct names")
        lines += sorted(set(seen.values()))
        body = [ast.unparse(f) for f in self.functions.values()]
        body += [statement_text(self.statements[n], n) for n in sorted(used)]
        return "\n".join(lines) + "\n\n\n" + "\n\n\n".join(body) + "\n"


def _cell(fn: types.FunctionType, name: str) -> Any:
    return fn.__closure__[fn.__code__.co_freevars.index(name)].cell_contents


def _method(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name and node.name != "_dycl_factory":
            return node
    raise AssertionError(f"no function {name} in the generated source")


def _site_index(node: ast.expr) -> int:
    assert isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant), ast.dump(node)
    return node.slice.value


class _Skeleton(ast.NodeTransformer):
    """Drops the statement functions (their torch code runs as exported regions) and points
    every operator call at the runtime."""

    def __init__(self, sites: list, file: str, program: HostProgram | None = None, fname: str = "") -> None:
        self.sites, self.file, self.program, self.fname = sites, file, program, fname

    def _region_id(self, spec: RegionSpec) -> int:
        assert self.program is not None
        if spec not in self.program.regions:
            self.program.regions.append(spec)
            self.program.region_fn.append(self.fname)
        return self.program.regions.index(spec)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
        if node.name.startswith("_dycl_s_"):
            assert self.program is not None
            self.program.statements[HostProgram.statement_name(self.fname, node.name)] = node
            return None
        if node.name.startswith(("_dycl_island_", "_dycl_tail_")):  # staged islands: exported as regions
            assert self.program is not None  # (kept to capture one again: `units`; never written out)
            self.program.islands[HostProgram.statement_name(self.fname, node.name)] = node
            return None
        raise DyclError(f"the host program defines the nested function `{node.name}`, which an exported "
                        "dispatch host cannot hold", location=Location(self.file, node.lineno, ""),
                        fix="define the function at module level, or convert with host=\"staged\"")

    def visit_Call(self, node: ast.Call) -> Any:
        self.generic_visit(node)
        f = node.func
        if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "rt"):
            return node
        if f.attr in ("region", "island"):
            rid = self._region_id(self.sites[_site_index(node.args[0])])
            return ast.Call(f, [ast.Constant(rid), node.args[2]], [])
        if f.attr == "chunked":  # a loop the live host runs in chunks (host/chunks.py): here its host loop runs
            return ast.Call(f, [], [])
        if f.attr == "decide":
            label = self.sites[_site_index(node.args[1])].label
            return ast.Call(f, [node.args[0], ast.Constant(label)], [])
        return node

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "_dycl_ops":
            if node.attr not in _CALLS and node.attr not in _NAMES:
                raise AssertionError(f"the dispatch skeleton calls operator {node.attr}, which has no runtime form")
            return ast.Attribute(ast.Name("rt", ast.Load()), _CALLS.get(node.attr, node.attr), node.ctx)
        return node


def _free_names(fn: ast.FunctionDef) -> set[str]:
    bound = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
    bound |= {a.arg for a in (fn.args.vararg, fn.args.kwarg) if a is not None}
    loads: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return loads - bound - {"rt"} - set(dir(builtins))


def _globals_text(names: set[str], namespace: dict, file: str, line: int) -> list[str]:
    """Imports and constants for the module globals the emitted code reads; anything else refused."""
    out = []
    for n in sorted(names):
        v = namespace.get(n, _MISSING)
        if isinstance(v, types.ModuleType) and v in _MODULES:
            out.append(f"import {_MODULES[v]} as {n}")
        elif v is None or type(v) in (bool, int, float, str):
            out.append(f"{n} = {v!r}")
        else:
            raise DyclError(f"the host program reads `{n}` ({type(v).__name__}), which the exported program "
                            "cannot hold without torch", location=Location(file, line, ""),
                            fix="compute it inside a region (a tensor statement), or convert with host=\"staged\"")
    return out


_MISSING = object()


def plain_statement(spec: RegionSpec, first: int, stop: int, program: HostProgram, fname: str,
                    arrays: bool, reads: set[str] = _ARRAY_READS) -> str | None:
    """Why statements [first, stop) cannot run as plain Python on numpy values (None: they can).
    With `arrays`, arrays come in: only Python values may be read out of them (`.item()`,
    `.tolist()`); a torch function or any other tensor method would need torch."""
    namespace = program.namespaces[fname]
    for st in spec.statements[first:stop]:
        fn = program.statements.get(HostProgram.statement_name(fname, st.fn))
        if fn is None:  # a staged island's function (`_dycl_tail_`): its statements are torch code
            return "it runs as a staged island"
        for node in ast.walk(fn):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "_dycl_ops" \
                    and node.attr not in _NAMES:
                return f"it calls the rewrite's operator `{node.attr}`"
            if isinstance(node, ast.Attribute) and arrays and node.attr not in reads \
                    and not (isinstance(node.value, ast.Name) and namespace.get(node.value.id) in _MODULES):
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "_dycl_ops")):
                    return f"it reads `.{node.attr}` of a value, which is a torch method on a tensor"
        for n in _free_names(fn):
            v = namespace.get(n, _MISSING)
            if not (n == "_dycl_ops" or isinstance(v, types.ModuleType) and v in _MODULES
                    or v is None or type(v) in (bool, int, float, str)):
                return f"it uses `{n}`, which needs torch"
    return None


def statement_text(fn: ast.FunctionDef, emitted: str) -> str:
    """A statement function at module level (its `_dycl_ops.Undefined` is the runtime's)."""
    fn = _Skeleton([], "").generic_visit(copy.deepcopy(fn))
    fn.name = emitted
    return ast.unparse(fn)


def host_program(dispatch: list, modules: dict[int, str], root: Any, method: str) -> HostProgram:
    """The dispatch-rewritten methods (`plan.dispatch`: (target, function) pairs; `modules`:
    module id -> path) as a torch-free program whose entry is `root.<method>`."""
    program = HostProgram()
    done: dict[Any, str] = {}
    for target, fn in dispatch:
        if id(target.owner) not in modules:
            raise DyclError(f"{fn.__qualname__} is rewritten for the dispatch host but is not a method of a module "
                            "of the model, which an exported host program cannot call",
                            fix="make it a method of a submodule, or convert with host=\"staged\"")
        fname = done.get(fn.__code__)
        if fname is None:
            fname = done[fn.__code__] = f"{type(target.owner).__name__}_{fn.__code__.co_name}_{len(done)}"
            filename = fn.__code__.co_filename
            skeleton = _method(ast.parse("".join(linecache.getlines(filename))), fn.__code__.co_name)
            sites = _cell(fn, "_dycl_sites")
            skeleton = _Skeleton(sites, filename, program, fname).generic_visit(skeleton)
            skeleton.name = fname
            skeleton.args.posonlyargs.insert(0, ast.arg("rt"))
            skeleton.decorator_list = []
            program.functions[fname] = ast.fix_missing_locations(skeleton)
            program.namespaces[fname] = fn.__globals__
            program.sites[fname] = sites
            program.files[fname] = sites[0].file if sites else filename
            program.generated[fname] = filename
        program.methods.setdefault(modules[id(target.owner)], {})[target.attr] = fname
        if target.owner is root and target.attr == method:
            program.entry = fname
    return program
