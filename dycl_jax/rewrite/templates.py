"""Small AST builders for generated code, and the per-function conversion context."""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from typing import Any

from dycl_jax.analysis.scopes import Access, block_access
from dycl_jax.rewrite.sites import Site
from dycl_jax.source.reader import FunctionSource

OPS = "_dycl_ops"  # the operators module, a closure variable of every rewritten function
SITES = "_dycl_sites"  # the Site table of the rewritten function
HELPER_PREFIX = "_dycl_fn_"  # rewritten helper functions called by name


@dataclass
class Context:
    """What converters share while rewriting one function."""

    src: FunctionSource
    sites: list[Site] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    helpers: dict[str, Any] = field(default_factory=dict)  # call name -> rewritten function
    # exit flag -> ("return" | "break" | "continue", the loop it leaves or restarts, or None)
    exits: dict[str, tuple[str, Any]] = field(default_factory=dict)
    counter: int = 0
    # `to_jax(..., max_len=N)`: unroll the method's decode loop (converters/decode_loops.py);
    # set for the converted method only, never for the helpers it calls
    unroll: Any = None
    unrolled: list[str] = field(default_factory=list)  # "while@model.py:12 (at most 8 iterations)"
    # dispatch rewrite: attributes of `self` whose module runs as a dispatch host of its own; a
    # statement calling one is an island whose host version calls it from the host program
    hosted: frozenset = frozenset()
    # dispatch rewrite: (tail island, the method's positional parameters) when the island is the
    # whole body and takes only parameters, so the host may call its program directly
    whole: Any = None
    # the source files of the model's modules and the functions it calls: where other code may
    # read an attribute the function assigns (converters/self_attributes.py)
    files: frozenset = frozenset()
    # the converted method itself, called once per call (not a helper or submodule method, which may
    # run several times in one call): where an attribute may be a local (converters/self_attributes.py)
    root: bool = False
    # names of the parameters, buffers and submodules of the instances it runs on: module state the
    # model keeps from one call to the next, never a local (converters/self_attributes.py)
    registered: frozenset = frozenset()

    def source_files(self) -> frozenset:
        """`files` and the function's own file."""
        return self.files | {self.src.file}

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"_dycl_{stem}_{self.counter}"

    def code(self, line: int) -> str:
        return self.src.location(line).code.strip()

    def add_site(self, kind: str, line: int, names: tuple[str, ...], paths: tuple[str, ...],
                 lines: tuple[tuple[int | None, ...], ...], dead_on_exit: tuple[str, ...] = (),
                 owned: tuple[str, ...] = (), live_after: tuple[str, ...] = (),
                 kept_aliases: tuple[tuple[str, str], ...] = (), pad: bool = False,
                 exit_flags: tuple[str, ...] = (), inputs: tuple[str, ...] = (), in_place: tuple[str, ...] = (),
                 unbound: tuple[str, ...] = (), rederived: tuple[tuple[str, str], ...] = (),
                 deep: tuple[str, ...] = (), made_aliases: tuple[tuple[str, str], ...] = (),
                 kept_elements: tuple[tuple[str, str], ...] = (),
                 exit_branch: tuple[str, int] | None = None) -> int:
        self.sites.append(Site(kind, self.src.file, line, self.code(line), names, paths, lines, dead_on_exit,
                               owned, live_after, kept_aliases, pad, exit_flags, inputs, in_place, unbound,
                               rederived, deep, made_aliases, kept_elements, exit_branch))
        return len(self.sites) - 1

    def warn(self, line: int, message: str) -> None:
        self.warnings.append(f"{os.path.basename(self.src.file)}:{line}: {message}")


def name(id_: str, store: bool = False) -> ast.Name:
    return ast.Name(id=id_, ctx=ast.Store() if store else ast.Load())


def const(value: Any) -> ast.Constant:
    return ast.Constant(value=value)


def tuple_of(names: list[str] | tuple[str, ...], store: bool = False) -> ast.Tuple:
    return ast.Tuple(elts=[name(n, store) for n in names], ctx=ast.Store() if store else ast.Load())


def op_call(op: str, *args: ast.expr, site: int | None = None) -> ast.Call:
    """`_dycl_ops.<op>(*args[, _dycl_sites[site]])`; the call remembers its site for codegen."""
    call_args = list(args)
    if site is not None:
        call_args.append(ast.Subscript(value=name(SITES), slice=const(site), ctx=ast.Load()))
    call = ast.Call(func=ast.Attribute(value=name(OPS), attr=op, ctx=ast.Load()), args=call_args, keywords=[])
    call._dycl_site = site  # type: ignore[attr-defined]
    return call


def assign(targets: list[str] | tuple[str, ...], value: ast.expr) -> ast.stmt:
    """`(a, b) = value`, `(a,) = value`, or `value` as a statement when there is no target."""
    if not targets:
        return ast.Expr(value=value)
    return ast.Assign(targets=[tuple_of(targets, store=True)], value=value)


def set_name(target: str, value: ast.expr) -> ast.Assign:
    return ast.Assign(targets=[name(target, store=True)], value=value)


def function(fn_name: str, params: list[str], body: list[ast.stmt], returns: list[str] | None) -> ast.FunctionDef:
    """`def fn_name(*params): body; return (returns...)`."""
    body = list(body)
    if returns is not None:
        body.append(ast.Return(value=tuple_of(returns)))
    if not body:
        body = [ast.Pass()]
    return ast.FunctionDef(
        name=fn_name,
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=p) for p in params], kwonlyargs=[], kw_defaults=[],
                           defaults=[]),
        body=body, decorator_list=[], returns=None)


def lambda_(params: list[str], body: ast.expr) -> ast.Lambda:
    """A generated lambda: called at once by its operator, so its reads are not closure reads
    that keep names live forever (see converters/branches.closure_reads)."""
    fn = ast.Lambda(args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=p) for p in params], kwonlyargs=[],
                                       kw_defaults=[], defaults=[]), body=body)
    fn._dycl_generated = True  # type: ignore[attr-defined]
    return fn


def locate(nodes: ast.AST | list, src: ast.AST) -> Any:
    """Give generated nodes the user line of `src` where they have none."""
    for root in nodes if isinstance(nodes, list) else [nodes]:
        for node in ast.walk(root):
            if "lineno" in node._attributes and not hasattr(node, "lineno"):
                ast.copy_location(node, src)
    return nodes


def last_assignment_line(body: list[ast.stmt], var: str) -> int | None:
    """Line of the last statement in `body` that assigns or updates `var` (nested blocks included)."""
    line = None
    for s in body:
        acc: Access = block_access([s])
        if var in acc.writes:
            inner = None
            for field_name in ("body", "orelse", "finalbody"):
                part = getattr(s, field_name, None)
                if isinstance(part, list) and part:
                    found = last_assignment_line(part, var)
                    inner = found if found is not None else inner
            line = inner if inner is not None else s.lineno
    return line


def stmt_blocks(node: ast.AST) -> list[list[ast.stmt]]:
    """The statement lists directly inside a statement (bodies, else, handlers, cases)."""
    blocks = []
    for field_name in ("body", "orelse", "finalbody"):
        part = getattr(node, field_name, None)
        if isinstance(part, list) and part and isinstance(part[0], ast.stmt):
            blocks.append(part)
    for h in getattr(node, "handlers", []) or []:
        blocks.append(h.body)
    for c in getattr(node, "cases", []) or []:
        blocks.append(c.body)
    return blocks


def is_scope(node: ast.AST) -> bool:
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda))


def user_scopes(fn: ast.FunctionDef) -> list[ast.FunctionDef]:
    """The function and every `def` nested in it (each is converted as its own scope)."""
    return [fn] + [n for n in ast.walk(fn) if isinstance(n, ast.FunctionDef) and n is not fn
                   and not getattr(n, "_dycl_generated", False)]


def own_statements(scope: ast.AST):
    """(statement, containing list) pairs of a scope, outer before inner, not entering nested defs."""
    yield from block_statements(scope.body)


def block_statements(block: list[ast.stmt]):
    """(statement, containing list) pairs of a block and the blocks nested in it, outer before
    inner, not entering nested defs."""
    for s in list(block):
        yield s, block
        if not is_scope(s):
            for inner in stmt_blocks(s):
                yield from block_statements(inner)
