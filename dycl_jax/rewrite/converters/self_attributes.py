"""Module attributes the converted method assigns (`self.exit_id = 1` in a branch, `self.steps += 1` in a
loop) become one local variable of the method, so branches and loops carry them as they carry
any local (a cond output, a loop carry) instead of assigning a module attribute once while traced.

    def forward(self, x):               def forward(self, x):
                                            dycl_self__steps = _dycl_ops.attribute(self, 'steps')
        self.steps = 0                      dycl_self__steps = 0
        while h.sum() > 1 and \\      →      while h.sum() > 1 and dycl_self__steps < 5:
                self.steps < 5:                 ...
            ...                                 dycl_self__steps += 1
            self.steps += 1                 return h, dycl_self__steps
        return h, self.steps

The module attribute itself is then never assigned by the converted method, so only the
converted method (`Context.root`: it runs once per call; a helper run twice would start its
second run from the stale attribute) keeps a local, only for a name that is no parameter, buffer
or submodule (`Context.registered`), and only where nothing else uses it: no `.steps` outside the
method's own code in the source files of the model's modules and functions (`Context.files`; a
parent reading `self.block.steps`, another method reading or bumping `self.steps`; `__init__`
does not run during a call), no nested function or lambda of the method using it, no `del`, and
no `getattr`/`setattr`/`vars`/`__dict__` on `self` in the method. (Its value at the next call is
the carried-state check's concern: capture/carried_state.py.)
"""
from __future__ import annotations

import ast
import collections
import functools

from dycl_jax.rewrite.templates import Context, const, is_scope, locate, name, op_call, set_name

_REFLECTION = {"getattr", "setattr", "delattr", "hasattr", "vars"}
LOCAL_PREFIX = "dycl_self__"  # + the attribute's name: the local that holds `self.<name>`


def _own_nodes(scope: ast.FunctionDef):
    """Every node of the function outside nested functions, lambdas and classes."""
    stack: list[ast.AST] = list(scope.body)
    while stack:
        node = stack.pop()
        yield node
        if not is_scope(node):
            stack.extend(ast.iter_child_nodes(node))


def _is_self_attr(node: ast.AST, self_name: str) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == self_name


def _reflects(node: ast.AST, self_name: str) -> bool:
    """`getattr(self, ...)`, `vars(self)`, `self.__dict__`: attributes reached by name at run time."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _REFLECTION:
        return any(isinstance(a, ast.Name) and a.id == self_name for a in node.args)
    return _is_self_attr(node, self_name) and node.attr == "__dict__"


def read_elsewhere(files: frozenset[str], own_file: str, own_line: int) -> frozenset[str]:
    """Attribute names the files use anywhere but in the function whose `def` is at
    `own_file:own_line` and in `__init__` methods (which do not run during a call): `blk.steps`,
    `self.block.steps`, and `self.steps` in another method, which may run during the call and
    read or write the module attribute (nested functions and lambdas of the function count too)."""
    out: set[str] = set()
    for f in sorted(files):
        total, per_function, inits = _attribute_uses(f)
        own = per_function.get(own_line, {}) if f == own_file else {}
        out |= {a for a, n in total.items() if n > own.get(a, 0) + inits.get(a, 0)}
    return frozenset(out)


@functools.lru_cache(maxsize=256)
def _attribute_uses(file: str) -> tuple[dict[str, int], dict[int, dict[str, int]], dict[str, int]]:
    """(uses of each attribute name in the file, the same counted per function `def` line over
    the function's own nodes only, and over the own nodes of every `__init__`)."""
    try:
        with open(file, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return {"*": 1}, {}, {}  # unknown: keep every attribute as it is
    total = collections.Counter(n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute))
    per_function = {}
    inits: collections.Counter = collections.Counter()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            uses = collections.Counter(n.attr for n in _own_nodes(fn) if isinstance(n, ast.Attribute))  # type: ignore[arg-type]
            per_function[fn.lineno] = dict(uses)
            if fn.name == "__init__":
                inits += uses
    return dict(total), per_function, dict(inits)


def _localised(scope: ast.FunctionDef, self_name: str, files: frozenset[str], own_file: str, own_line: int) -> list[str]:
    """The attributes to keep local, in order of first assignment."""
    stored: dict[str, None] = {}
    refused: set[str] = set()
    for node in _own_nodes(scope):
        if _reflects(node, self_name):
            return []
        if _is_self_attr(node, self_name):
            if isinstance(node.ctx, ast.Store):
                stored.setdefault(node.attr)
            elif isinstance(node.ctx, ast.Del):
                refused.add(node.attr)
    for node in ast.walk(scope):  # a nested function assigning it would need `nonlocal`
        if is_scope(node) and node is not scope:
            refused |= {n.attr for n in ast.walk(node) if _is_self_attr(n, self_name)
                        and isinstance(n.ctx, (ast.Store, ast.Del))}
    elsewhere = read_elsewhere(files, own_file, own_line)
    if "*" in elsewhere:
        return []
    return [a for a in stored if a not in refused and a not in elsewhere and not a.startswith("__")]



class _ToLocal(ast.NodeTransformer):
    def __init__(self, self_name: str, names: dict[str, str]) -> None:
        self.self_name, self.names = self_name, names

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if _is_self_attr(node, self.self_name) and node.attr in self.names:
            return ast.copy_location(ast.Name(id=self.names[node.attr], ctx=node.ctx), node)
        return self.generic_visit(node)

    def _scope(self, node: ast.AST) -> ast.AST:
        return node  # nested functions and lambdas read the module attribute as written

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = _scope


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    if scope is not ctx.src.tree or not ctx.root:
        return  # a method called more than once per call would start each call from the stale attribute
    self_name = ctx.src.self_name
    if self_name is None:
        return
    attrs = [a for a in _localised(scope, self_name, ctx.source_files(), ctx.src.file, ctx.src.line)
             if a not in ctx.registered]  # a buffer the model keeps for the next call (carried_state.py)
    if not attrs:
        return
    # (not a `_dycl_` name: the converters after this one take those for single-assignment temporaries)
    names = {a: f"{LOCAL_PREFIX}{a}" for a in attrs}
    transformer = _ToLocal(self_name, names)
    scope.body = [transformer.visit(s) for s in scope.body]
    first = scope.body[0]
    inits = [locate(set_name(local, op_call("attribute", name(self_name), const(a))), first)
             for a, local in names.items()]
    at = 1 if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
        and isinstance(first.value.value, str) else 0  # after a docstring
    scope.body[at:at] = inits
    ast.fix_missing_locations(scope)
