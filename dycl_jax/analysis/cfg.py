"""Control-flow graph of one function scope, and liveness of its local variables."""
from __future__ import annotations

import ast
from dataclasses import dataclass, field

from dycl_jax.analysis.scopes import Access, access, function_locals


@dataclass(eq=False)
class Node:
    """A straight-line piece: a simple statement, a test, a loop header, or an empty join."""

    acc: Access
    label: str = ""
    succ: list["Node"] = field(default_factory=list)
    live_in: set[str] = field(default_factory=set)


@dataclass
class _Loop:
    header: Node
    join: Node


class CFG:
    """Built backwards: each statement links to what follows it, loops to their header."""

    def __init__(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.nodes: list[Node] = []
        self.exit = self._node(Access(), "exit")
        self.join: dict[int, Node] = {}  # id(compound stmt) -> node reached right after it
        self.header: dict[int, Node] = {}  # id(loop) -> its header (test / next item)
        self.entry_of: dict[int, Node] = {}  # id(stmt list) -> first node of that block
        self.follow: dict[int, Node] = {}  # id(stmt) -> the node run right after it finishes normally
        self.start: dict[int, Node] = {}  # id(stmt) -> its first node
        self._loops: list[_Loop] = []
        self.entry = self._block(fn.body, self.exit)

    def _node(self, acc: Access, label: str = "") -> Node:
        node = Node(acc, label)
        self.nodes.append(node)
        return node

    def _block(self, stmts: list[ast.stmt], follow: Node) -> Node:
        entry = follow
        for s in reversed(stmts):
            self.follow[id(s)] = entry
            entry = self.start[id(s)] = self._stmt(s, entry)
        self.entry_of[id(stmts)] = entry
        return entry

    def _stmt(self, s: ast.stmt, follow: Node) -> Node:
        if isinstance(s, ast.If):
            join = self._join(s, follow)
            test = self._node(access(s.test), "if")
            test.succ = [self._block(s.body, join), self._block(s.orelse, join)]
            return test
        if isinstance(s, (ast.While, ast.For, ast.AsyncFor)):
            join = self._join(s, follow)
            if isinstance(s, ast.While):
                header = self._node(access(s.test), "while")
            else:  # the iterable is read once, the target bound on every iteration
                header = self._node(access(s.iter).update(access(s.target)), "for")
            self.header[id(s)] = header
            self._loops.append(_Loop(header, join))
            body = self._block(s.body, header)
            self._loops.pop()
            header.succ = [body, self._block(s.orelse, join)]
            return header
        if isinstance(s, ast.Break):
            return self._jump(self._loops[-1].join if self._loops else self.exit, "break")
        if isinstance(s, ast.Continue):
            return self._jump(self._loops[-1].header if self._loops else self.exit, "continue")
        if isinstance(s, (ast.Return, ast.Raise)):
            node = self._node(access(s), "return")
            node.succ = [self.exit]
            return node
        if isinstance(s, (ast.With, ast.AsyncWith)):
            join = self._join(s, follow)
            node = self._node(access(*s.items), "with")
            node.succ = [self._block(s.body, join)]
            return node
        if isinstance(s, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            return self._try(s, follow)
        if isinstance(s, ast.Match):
            join = self._join(s, follow)
            node = self._node(access(s.subject), "match")
            for case in s.cases:
                pattern = self._node(access(case.pattern, case.guard), "case")
                pattern.succ = [self._block(case.body, join)]
                node.succ.append(pattern)
            node.succ.append(join)
            return node
        node = self._node(access(s), type(s).__name__)
        node.succ = [follow]
        return node

    def _join(self, s: ast.stmt, follow: Node) -> Node:
        join = self._node(Access(), "join")
        join.succ = [follow]
        self.join[id(s)] = join
        return join

    def _jump(self, target: Node, label: str) -> Node:
        node = self._node(Access(), label)
        node.succ = [target]
        return node

    def _try(self, s: ast.Try, follow: Node) -> Node:
        join = self._join(s, follow)
        after = self._block(s.finalbody, join) if s.finalbody else join
        handlers = []
        for h in s.handlers:
            hnode = self._node(access(h.type) if h.type else Access(), "except")
            if h.name:
                hnode.acc.binds.add(h.name)
            hnode.succ = [self._block(h.body, after)]
            handlers.append(hnode)
        first = len(self.nodes)
        body = self._block(s.body, self._block(s.orelse, after))
        # any statement of the body may raise into any handler (or skip to `finally`)
        for node in self.nodes[first:]:
            node.succ.extend(handlers)
        entry = self._node(Access(), "try")
        entry.succ = [body, *handlers]
        return entry


class Liveness:
    """Which local variables may be read later, at each point of interest."""

    def __init__(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, always_live: set[str] = frozenset(),
                 live_at_exit: set[str] = frozenset()) -> None:
        self.locals = function_locals(fn)
        self.cfg = CFG(fn)
        self._starts = {id(node) for node in self.cfg.start.values()}
        self._solve(set(always_live) & self.locals, set(live_at_exit) & self.locals)

    def _solve(self, always: set[str], at_exit: set[str]) -> None:
        nodes = self.cfg.nodes
        changed = True
        while changed:
            changed = False
            for node in reversed(nodes):
                out: set[str] = set(always) | (at_exit if node is self.cfg.exit else set())
                for s in node.succ:
                    out |= s.live_in
                new = ((node.acc.reads | node.acc.mutates) & self.locals) | (out - node.acc.binds)
                if new != node.live_in:
                    node.live_in = new
                    changed = True

    def after(self, stmt: ast.stmt) -> set[str]:
        """Live right after a compound statement finishes normally."""
        return set(self.cfg.join[id(stmt)].live_in)

    def following(self, stmt: ast.stmt) -> set[str] | None:
        """Live right after any statement of the function finishes normally (None: not one of its statements)."""
        node = self.cfg.follow.get(id(stmt))
        return None if node is None else set(node.live_in)

    def before(self, stmt: ast.stmt) -> set[str] | None:
        """Live right before a statement of the function starts (None: not one of its statements)."""
        node = self.cfg.start.get(id(stmt))
        return None if node is None else set(node.live_in)

    def entry(self, block: list[ast.stmt]) -> set[str]:
        """Live at the start of a block (a branch or loop body)."""
        return set(self.cfg.entry_of[id(block)].live_in)

    def header(self, loop: ast.stmt) -> set[str]:
        """Live at a loop's header: before each test / each next item."""
        return set(self.cfg.header[id(loop)].live_in)

    def updated_on_entry(self, block: list[ast.stmt]) -> set[str]:
        """Names whose value on entry to `block` it may update in place: an in-place update
        (`Access.mutates`) reached from the block's start without passing a statement that
        binds the name to a new tensor first (`fresh_binding`). `h = h.clone(); h[:, 0] = 0.0`
        updates a new tensor, never the caller's `h`; `if t: h = h.clone()` then `h.add_(1)`, or
        `h = h[:, 1:]` (a view) then `h.add_(1)`, may update the old one."""
        # the block's nodes (by id): each with its statement
        inside = {id(self.cfg.start[id(s)]): (self.cfg.start[id(s)], s) for st in block for s in ast.walk(st)
                  if isinstance(s, ast.stmt) and id(s) in self.cfg.start}
        out: set[str] = set()
        for name in set().union(*(node.acc.mutates for node, _ in inside.values())):
            seen: set[int] = set()
            stack = [self.cfg.entry_of[id(block)]]
            while stack and name not in out:
                node = stack.pop()
                if id(node) in seen or (id(node) in self._starts and id(node) not in inside):
                    continue  # out of the block: an outer statement, or a loop's header
                seen.add(id(node))
                if name in node.acc.mutates:
                    out.add(name)
                elif fresh_binding(inside.get(id(node), (None, None))[1]) != name:
                    stack.extend(node.succ)
        return out


_FACTORIES = frozenset({"clone", "zeros", "ones", "empty", "full", "zeros_like", "ones_like", "empty_like",
                        "full_like", "rand", "randn", "rand_like", "randn_like", "tensor", "arange", "cat", "stack"})


def fresh_binding(stmt: ast.stmt | None) -> str | None:
    """The name `stmt` binds to a tensor with storage of its own: `x = <e>.clone()`, `x =
    torch.zeros(...)` and the like, `x = a * b`, `x = -a`. Anything else (a view, a module's
    output that may be its input, a converted construct's output that may be an input passed
    through) may still be an older tensor."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        return None
    value = stmt.value
    if isinstance(value, (ast.BinOp, ast.UnaryOp)):
        return stmt.targets[0].id
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _FACTORIES \
            and (value.func.attr == "clone" or (isinstance(value.func.value, ast.Name) and value.func.value.id == "torch")):
        return stmt.targets[0].id
    return None
