"""A statement that changes state through `self` or outside the function (`self.open = 1`, `self.stats["n"] = v`,
`self.hist.append(i)`, `setattr(self, name, v)`) gets a `refuse_attribute_store` call before it.

The call does nothing where the statement runs as Python. It raises a located error while a
staged branch or loop body is traced (`staged.in_construct()`, or a padded program's reach):
there each path would run the change once, at trace time, whatever the data decides, and the
module would keep the traced value. The check is made when the statement runs, not where it is
written, so a helper method that changes an attribute is refused when a data-dependent `if` of
its caller calls it, and runs as written when its caller calls it unconditionally. `auto` then
moves the construct to the dispatch host, whose regions take written attributes as state
(host/attributes.py); an island of that host runs its host version.

An attribute that only the converted method uses is a local by now (self_attributes.py) and is
carried by branches and loops like any local: no call for it."""
from __future__ import annotations

import ast
import builtins
import functools
import types

from dycl_jax.analysis.scopes import scope_bound
from dycl_jax.errors import DyclError, limitation
from dycl_jax.rewrite.templates import Context, const, is_scope, locate, op_call, stmt_blocks

# methods that change the list, dict or set they are called on
_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "update",
                       "setdefault", "popitem", "add", "discard", "difference_update", "intersection_update",
                       "symmetric_difference_update", "__setitem__", "__delitem__"})


def _rooted(node: ast.AST, self_name: str, outer: frozenset[str] = frozenset()) -> bool:
    """`self.a`, `self.a.b`, `self.a[k].b`: a value reached from an attribute of `self`; or `G`,
    `G[k]`, `G.a` of a name in `outer` (a global or an enclosing function's variable)."""
    seen_attribute = False
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        seen_attribute |= isinstance(node, ast.Attribute)
        node = node.value
    if not isinstance(node, ast.Name):
        return False
    return node.id in outer or seen_attribute and node.id == self_name


def _stored(target: ast.AST, self_name: str, outer: frozenset[str], declared: set[str]) -> str | None:
    """The text of the first module-state target in an assignment or `del` target (a name the
    function declares `global` or `nonlocal` included)."""
    for node in ast.walk(target):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)) and node.id in declared:
            return node.id
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Store, ast.Del)):
            root = node.value
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                root = root.value
            # any object's attribute: a staged path would set it once while traced (not a generated name)
            if not (isinstance(root, ast.Name) and root.id.startswith("_dycl_")):
                return ast.unparse(node)
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                and _rooted(node.value, self_name, outer):
            return ast.unparse(node)
    return None


def _expressions(s: ast.stmt) -> list[ast.AST]:
    """The expressions a statement itself evaluates (a compound statement's header only)."""
    if isinstance(s, (ast.If, ast.While)):
        return [s.test]
    if isinstance(s, (ast.For, ast.AsyncFor)):
        return [s.iter]
    if isinstance(s, (ast.With, ast.AsyncWith)):
        return [i.context_expr for i in s.items]
    if isinstance(s, ast.Try) or is_scope(s):
        return []
    return [s]


def _mutating_call(s: ast.stmt, self_name: str, outer: frozenset[str]) -> str | None:
    """The text of a call in the statement that changes state reached from `self`."""
    stack = _expressions(s)
    while stack:
        node = stack.pop()
        if is_scope(node):
            continue  # a lambda's body runs where it is called
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in _MUTATORS and _rooted(f.value, self_name, outer):
                return ast.unparse(node)
            if isinstance(f, ast.Name) and f.id in ("setattr", "delattr") and node.args \
                    and (isinstance(node.args[0], ast.Name) and node.args[0].id == self_name
                         or _rooted(node.args[0], self_name)):
                return ast.unparse(node)
        stack.extend(ast.iter_child_nodes(node))
    return None


def targets(s: ast.stmt) -> list[ast.expr]:
    """What an assignment or `del` binds (nothing for other statements)."""
    if isinstance(s, (ast.Assign, ast.Delete)):
        return s.targets
    return [s.target] if isinstance(s, (ast.AugAssign, ast.AnnAssign)) else []


def _changed(s: ast.stmt, self_name: str, outer: frozenset[str], declared: set[str]) -> str | None:
    for t in targets(s):
        found = _stored(t, self_name, outer, declared)
        if found is not None:
            return found
    return _mutating_call(s, self_name, outer)


def _outer_change(s: ast.stmt, outer: frozenset[str], declared: set[str]) -> bool:
    """Whether the statement changes a global or an enclosing function's variable: assigns a name
    declared `global`/`nonlocal`, or stores into, or calls a mutating method of, a value reached
    from such a name (`COUNTS["n"] = 1`, `CONFIG.x = 1`, `SEEN.append(t)`)."""
    for t in targets(s):
        for node in ast.walk(t):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)) and node.id in declared:
                return True
            if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)) \
                    and _rooted(node.value, "", outer):
                return True
    return _mutating_call(s, "", outer) is not None


def _guard(body: list[ast.stmt], self_name: str, ctx: Context, outer: frozenset[str], declared: set[str],
           refuse_outer: bool = False) -> None:
    for i in range(len(body) - 1, -1, -1):
        s = body[i]
        if is_scope(s):
            continue  # converted as its own scope
        for inner in stmt_blocks(s):
            _guard(inner, self_name, ctx, outer, declared, refuse_outer)
        for handler in getattr(s, "handlers", ()):
            _guard(handler.body, self_name, ctx, outer, declared, refuse_outer)
        what = _changed(s, self_name, outer, declared)
        if what is not None and refuse_outer and _outer_change(s, outer, declared):
            raise DyclError(
                f"`{what}` changes a global or a variable of an enclosing function: the dispatch host's compiled "
                "regions take such values when they start and never write them back", location=ctx.src.location(s.lineno),
                fix=limitation(f"changes of state outside the method and its module (`{what}`) on the dispatch host",
                               "dycl_jax/rewrite/converters/attribute_stores.py",
                               alternative='host="staged" converts it where no data-dependent branch or loop runs it'))
        if what is not None:
            loc = ctx.src.location(s.lineno)
            refuse = op_call("refuse_attribute_store", const(what), const(loc.file), const(loc.line),
                             const(loc.code))
            body.insert(i, locate(ast.Expr(value=refuse), s))


def convert(scope: ast.FunctionDef, ctx: Context, dispatch: bool = False) -> None:
    self_name = ctx.src.self_name
    local, declared = scope_bound(scope)
    # names of state outside the function: globals holding data (a list, a dict, an object; not a
    # module, class or function: `torch.add(...)` changes nothing) and enclosing functions'
    # variables (a list there changed in a staged path would keep the traced change, as an
    # attribute would)
    found = ctx.src.fn.__globals__
    outer = frozenset(n for n in _names(scope) if n not in local and not n.startswith("_dycl_")
                      and _holds_state(found, n)) | frozenset(declared)
    _guard(scope.body, self_name or "", ctx, outer, declared, refuse_outer=dispatch)


def _holds_state(found: dict, name: str) -> bool:
    if name not in found:
        return not hasattr(builtins, name)  # a variable of an enclosing function (or a late global)
    value = found[name]
    return not isinstance(value, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType,
                                  functools.partial)) and not callable(value)


def convert_dispatch(scope: ast.FunctionDef, ctx: Context) -> None:
    """The dispatch rewrite's: the same calls, and a located refusal of a change to a global or an
    enclosing function's variable (a module attribute is state the dispatch host carries)."""
    convert(scope, ctx, dispatch=True)


def _names(scope: ast.FunctionDef) -> set[str]:
    return {n.id for n in ast.walk(scope) if isinstance(n, ast.Name)}
