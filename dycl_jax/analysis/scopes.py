"""Names per scope: what a piece of code reads, binds and mutates (nested scopes included)."""
from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass, field

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
          ast.DictComp, ast.GeneratorExp)
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
# methods that change a list / dict / set / deque in place (not `add` / `sort`: on tensors they
# return a new tensor, and tensors are far more common in the code we read)
CONTAINER_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "popitem",
                      "appendleft", "extendleft", "popleft", "discard"}


@dataclass
class Access:
    """Names a fragment of code uses in the scope it runs in."""

    reads: set[str] = field(default_factory=set)
    binds: set[str] = field(default_factory=set)  # rebinds the name (kills it for liveness)
    mutates: set[str] = field(default_factory=set)  # changes the object in place: x[i] = v, x.add_(1)
    # of `mutates`, those whose update may reach an object the name holds rather than (or as well
    # as) the object itself: `xs[0].add_(1)`, `xs[0] += v`, `xs[0][1] = v` (a tensor in a list)
    deep: set[str] = field(default_factory=set)

    @property
    def writes(self) -> set[str]:
        return self.binds | self.mutates

    def update(self, other: "Access") -> "Access":
        self.reads |= other.reads
        self.binds |= other.binds
        self.mutates |= other.mutates
        self.deep |= other.deep
        return self


def _param_names(args: ast.arguments) -> set[str]:
    names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    return names


def _held(node: ast.AST) -> bool:
    """`xs[0]`, `o.t`, `xs[0][1]`: an object reached through another (not the name itself)."""
    return isinstance(node, (ast.Subscript, ast.Attribute))


def _base_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Subscript, ast.Attribute, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _chosen(node: ast.AST) -> list[ast.AST]:
    """The expressions whose object `node` may be: `done if c else beams` either, `b or a` any
    operand, `(x := y)` y; others themselves. An update of the result is an update of one of them."""
    if isinstance(node, ast.IfExp):
        return _chosen(node.body) + _chosen(node.orelse)
    if isinstance(node, ast.BoolOp):
        return [e for v in node.values for e in _chosen(v)]
    if isinstance(node, ast.NamedExpr):
        return _chosen(node.value)
    return [node]


def _local_chain(node: ast.AST) -> bool:
    """`xs`, `xs[0]`, `xs[i][j]`: a local name or an object held by it through subscripts (an
    attribute on the way, `self.cache[k]`, is a module's object rather than a local's)."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return isinstance(node, ast.Name)


class _Scanner(ast.NodeVisitor):
    """Collects accesses of one fragment without entering nested scopes (their free names are reads)."""

    def __init__(self) -> None:
        self.acc = Access()
        self.declared: set[str] = set()  # global / nonlocal

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.acc.reads.add(node.id)
        else:
            self.acc.binds.add(node.id)

    def _store_target(self, target: ast.AST, deep: bool = False) -> None:
        if isinstance(target, (ast.Subscript, ast.Attribute)):
            for held in _chosen(target.value):  # (`(a if c else b)[0] = v` updates a or b)
                base = _base_name(held)
                if base:
                    self.acc.mutates.add(base)
                    self.acc.reads.add(base)
                    if deep or _held(held):
                        self.acc.deep.add(base)
        self.visit(target)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for t in node.targets:
            self._store_target(t)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
            self._store_target(node.target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        if isinstance(node.target, ast.Name):
            # `x += y` reads x, rebinds it, and mutates the object when it is a tensor
            self.acc.reads.add(node.target.id)
            self.acc.binds.add(node.target.id)
            self.acc.mutates.add(node.target.id)
        else:  # `xs[0] += v`: the tensor xs[0] in place, when xs is a list of tensors
            self._store_target(node.target, deep=True)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr.endswith("_") and not func.attr.startswith("_"):
            for held in _chosen(func.value):
                base = _base_name(held)
                if base:  # x.add_(1), x[0].zero_(), (a or b).mul_(2): in-place tensor methods
                    self.acc.mutates.add(base)
                    if _held(held):
                        self.acc.deep.add(base)
        elif isinstance(func, ast.Attribute) and func.attr in CONTAINER_MUTATORS:
            # outs.append(y), groups[k].append(y), (done if c else beams).append(y): the list is
            # an output of a branch that appends to it (only a local container or one a local
            # holds; `self.cache.update(...)` changes no local)
            for held in _chosen(func.value):
                if _local_chain(held):
                    base = _base_name(held)
                    self.acc.mutates.add(base)
                    if _held(held):
                        self.acc.deep.add(base)
        # a user method or function that may update an argument in place (`effects.mark`): `b = self.bumped(v)`
        self.acc.mutates |= getattr(node, "_dycl_updates", frozenset())
        for kw in node.keywords:  # torch.add(a, b, out=v): torch writes the result into v
            if kw.arg == "out" and (base := _base_name(kw.value)):
                self.acc.mutates.add(base)
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.declared |= set(node.names)

    visit_Nonlocal = visit_Global

    def visit_alias(self, node: ast.alias) -> None:
        if node.name != "*":
            self.acc.binds.add((node.asname or node.name).split(".")[0])

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.acc.binds.add(node.name)
        self.generic_visit(node)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.name:
            self.acc.binds.add(node.name)
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self.acc.binds.add(node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        if node.rest:
            self.acc.binds.add(node.rest)
        self.generic_visit(node)

    def _nested(self, node: ast.AST) -> None:
        self.acc.reads |= free_names(node)
        self.acc.binds |= walrus_targets(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for d in (*node.decorator_list, *node.args.defaults, *[d for d in node.args.kw_defaults if d]):
            self.visit(d)
        self._nested(node)
        self.acc.binds.add(node.name)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for d in (*node.decorator_list, *node.bases, *node.keywords):
            self.visit(d)
        self._nested(node)
        self.acc.binds.add(node.name)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for d in (*node.args.defaults, *[d for d in node.args.kw_defaults if d]):
            self.visit(d)
        self._nested(node)

    def _comp(self, node: ast.AST) -> None:
        self.visit(node.generators[0].iter)  # the first iterable runs in the enclosing scope
        self._nested(node)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comp


def access(*fragments: ast.AST | None) -> Access:
    """Reads/binds/mutates of expressions or simple statements, in the scope they run in."""
    scanner = _Scanner()
    for frag in fragments:
        if frag is not None:
            scanner.visit(frag)
    return scanner.acc


def helper_arguments(node: ast.AST) -> set[str]:
    """Names passed (as they are, or indexed: `v[0]`) to a call made for its effect: a statement
    that is only a call (its value unused) of a plain function name other than a builtin
    (`bump(v, n)`) or of a method of `self` (`self.scale(v[0], n)`). Such a function may update
    the tensor in place, which a statement that does not rebind `v` would lose. A call whose
    value is used (`h = self.layer(x)`) is not one: the region would return every argument of
    every layer call. `torch.*` / `F.*` calls and tensor methods are not helpers: their in-place
    forms end in `_` or take `out=`."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return set()
    call = node.value
    if not (isinstance(call.func, ast.Name) and call.func.id not in _BUILTINS
            or isinstance(call.func, ast.Attribute) and _is_self(call.func.value)):
        return set()
    return {b for a in (*call.args, *(k.value for k in call.keywords))
            if isinstance(a, (ast.Name, ast.Subscript)) and (b := _base_name(a))}


def _is_self(node: ast.AST) -> bool:
    """`self` (a method of the module: `self.bump(v)`, `self.layer(h)`)."""
    return isinstance(node, ast.Name) and node.id == "self"


_BUILTINS = frozenset(dir(builtins))


def block_access(stmts: list[ast.stmt]) -> Access:
    """Accesses of a block, nested compound statements included (not nested scopes' locals)."""
    scanner = _Scanner()
    for s in stmts:
        scanner.visit(s)
    return scanner.acc


def walrus_targets(node: ast.AST) -> set[str]:
    """`(x := ...)` inside comprehensions binds x in the enclosing function."""
    if not isinstance(node, COMPREHENSIONS):
        return set()
    return {n.target.id for n in ast.walk(node) if isinstance(n, ast.NamedExpr)}


def _scope_body(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return list(node.body)
    if isinstance(node, ast.Lambda):
        return [node.body]
    # comprehension: element(s), conditions, later iterables, targets
    parts: list[ast.AST] = []
    for i, gen in enumerate(node.generators):
        parts.append(gen.target)
        if i:
            parts.append(gen.iter)
        parts.extend(gen.ifs)
    parts.extend([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt])
    return parts


def scope_bound(node: ast.AST) -> tuple[set[str], set[str]]:
    """(names local to the scope, names it declares global/nonlocal)."""
    scanner = _Scanner()
    for part in _scope_body(node):
        scanner.visit(part)
    bound = set(scanner.acc.binds)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        bound |= _param_names(node.args)
    return bound - scanner.declared, scanner.declared


def free_names(node: ast.AST) -> set[str]:
    """Names a nested scope reads from enclosing scopes (or globals)."""
    scanner = _Scanner()
    for part in _scope_body(node):
        scanner.visit(part)
    bound, _ = scope_bound(node)
    return (scanner.acc.reads | scanner.acc.mutates) - bound


def function_locals(fn: ast.FunctionDef | ast.Lambda) -> set[str]:
    """Parameters and names assigned in the function body (Python's local-variable rule)."""
    return scope_bound(fn)[0]


def param_names(fn: ast.FunctionDef | ast.Lambda) -> set[str]:
    return _param_names(fn.args)
