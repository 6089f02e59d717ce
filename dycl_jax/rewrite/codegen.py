"""Generated source: unparse with line bookkeeping, compile under `<dycl-rewrite:...>`,
register it in linecache and the origin map, and build the new function object."""
from __future__ import annotations

import ast
import re
import types
from dataclasses import dataclass, field
from typing import Any

from dycl_jax.rewrite import operators
from dycl_jax.rewrite.sites import Site
from dycl_jax.rewrite.templates import OPS, SITES, Context
from dycl_jax.source import origins
from dycl_jax.source.reader import find_code, module_imports

_STMT = "\x00"  # markers in the unparsed text: \x00<user line>\x00 and \x01<site index>\x01
_SITE = "\x01"
_MARK = re.compile("\x00(\\d+)\x00|\x01(\\d+)\x01")
_OWN_LINE_OPS = {"cond", "switch", "while_loop", "ifexp"}


class _Unparser(ast._Unparser):  # type: ignore[name-defined,misc]
    """ast.unparse that tags statement lines with their user line and puts each operator call
    with a site on a line of its own (so a stack frame line names exactly one site)."""

    def __init__(self, **options: Any) -> None:
        # ast builds a nested unparser of this class for each f-string's expressions
        # (`type(self)(_avoid_backslashes=True)`): its options pass through
        super().__init__(**options)
        self._lines: list[int] = []

    def traverse(self, node: Any) -> None:
        pushed = isinstance(node, ast.stmt) and hasattr(node, "lineno")
        if pushed:
            self._lines.append(node.lineno)
        super().traverse(node)
        if pushed:
            self._lines.pop()

    def fill(self, text: str = "") -> None:
        self.maybe_newline()
        mark = f"{_STMT}{self._lines[-1]}{_STMT}" if self._lines else ""
        self.write("    " * self._indent + mark + text)

    def visit_Call(self, node: ast.Call) -> None:
        site = getattr(node, "_dycl_site", None)
        if site is None:
            return super().visit_Call(node)
        statement_level = getattr(node, "_dycl_statement", False)
        if not statement_level:  # inside an expression: own line, inside parentheses
            self.write("(\n" + "    " * (self._indent + 1))
        self.write(f"{_SITE}{site}{_SITE}")
        super().visit_Call(node)
        if not statement_level:
            self.write(")")


def _mark_statement_calls(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.Expr)) and isinstance(node.value, ast.Call):
            node.value._dycl_statement = True  # type: ignore[attr-defined]


@dataclass
class Generated:
    """The generated text and what each of its lines came from."""

    text: str
    origin: dict[int, int] = field(default_factory=dict)  # generated line -> user line
    sites: dict[int, int] = field(default_factory=dict)  # generated line -> site index


def unparse(tree: ast.AST) -> Generated:
    _mark_statement_calls(tree)
    raw = _Unparser().visit(tree)
    out = Generated("")
    lines = []
    current: int | None = None
    for i, line in enumerate(raw.split("\n"), start=1):
        for m in _MARK.finditer(line):
            if m.group(1):
                current = int(m.group(1))
            else:
                out.sites[i] = int(m.group(2))
        if current is not None:
            out.origin[i] = current
        lines.append(_MARK.sub("", line))
    out.text = "\n".join(lines) + "\n"
    return out


def keep_frames(code: types.CodeType) -> None:
    """Keep frames of this code in the stack traces torch.export records.

    Export keeps only frames of functions named `forward`, plus registered anchors; frames of
    generated branch functions (and of rewritten helpers) are what maps a graph node back to
    its decision site and user line.
    """
    import torch.fx.proxy as fx_proxy

    anchors = getattr(fx_proxy, "_STACK_TRACE_ANCHORS", None)
    if anchors is None:
        return
    stack = [code]
    while stack:
        c = stack.pop()
        anchors.add((c.co_filename, c.co_name))
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))


def _wrap(tree: ast.FunctionDef, ctx: Context, freevars: tuple[str, ...], extra: tuple[str, ...]) -> ast.Module:
    """The factory/class wrapper of `compile_in_context`, as a module to unparse."""
    inner: ast.stmt = tree
    if ctx.src.class_name is not None:
        inner = ast.ClassDef(name=ctx.src.class_name, bases=[], keywords=[], body=[tree], decorator_list=[])
    params = [v for v in (*extra, *freevars) if v != "__class__"]
    factory = ast.FunctionDef(
        name="_dycl_factory",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=p) for p in params], kwonlyargs=[], kw_defaults=[],
                           defaults=[]),
        body=[inner], decorator_list=[], returns=None)
    # the same import stubs as for verification: the generated code compiles like the original
    stubs = [ast.Import(names=[ast.alias(name=n)]) for n in sorted(module_imports(ctx.src.fn.__code__.co_filename))]
    body: list[ast.stmt] = [ast.If(test=ast.Constant(value=False), body=stubs, orelse=[])] if stubs else []
    return ast.fix_missing_locations(ast.Module(body=[*body, factory], type_ignores=[]))


def build(ctx: Context, tree: ast.FunctionDef) -> tuple[types.FunctionType, str, Generated]:
    """Compile the rewritten tree into a function sharing the original's globals and cells."""
    fn = ctx.src.fn
    code = fn.__code__
    helpers = {f"_dycl_fn_{k}": v for k, v in ctx.helpers.items()}
    extra = (OPS, SITES, *helpers)
    gen = unparse(_wrap(tree, ctx, code.co_freevars, extra))
    filename = origins.unique_filename(fn.__qualname__.replace(".<locals>", ""), gen.text)
    origins.register_text(filename, gen.text)
    sites: list[Site] = ctx.sites
    for line, user_line in gen.origin.items():
        site = sites[gen.sites[line]].label if line in gen.sites else None
        origins.add(filename, line, ctx.src.location(user_line), site)
    module = compile(gen.text, filename, "exec", flags=ctx.src.future_flags, dont_inherit=True)
    keep_frames(module)
    new_code = find_code(module, tree.name)
    cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
    cells.update({OPS: types.CellType(operators), SITES: types.CellType(sites)})
    cells.update(helpers)  # helper cells are shared: filled once every helper is rewritten
    closure = tuple(cells[v] for v in new_code.co_freevars)
    new = types.FunctionType(new_code, fn.__globals__, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__dict__.update(fn.__dict__)
    new.__qualname__ = fn.__qualname__
    new.__module__ = fn.__module__
    new.__doc__ = fn.__doc__
    new.__annotations__ = dict(getattr(fn, "__annotations__", {}))
    new.__dycl_source__ = filename  # type: ignore[attr-defined]
    return new, filename, gen
