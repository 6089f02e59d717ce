"""Dispatch split: control flow stays plain Python on the host; every run of simple statements
between two host decisions becomes one region of per-statement unit functions.

`if t:` becomes `_t = t` (inside the preceding region) and `if _dycl_ops.decide(_t, site):`;
`while t:` becomes `while True:` testing a region-computed `_t`; `for x in it:` iterates a
region-computed iterable; `return e` returns a region-computed value. Region inputs are the
names a run reads before writing them; its outputs the names it writes that are read anywhere
else in the function (or again by itself, for the next loop iteration).
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import itertools
from collections import Counter
from typing import Callable

from dycl_jax.analysis.scopes import Access, access, function_locals, helper_arguments, param_names
from dycl_jax.rewrite.appends import appended, copied, rebound
from dycl_jax.rewrite.converters.branches import liveness
from dycl_jax.rewrite.converters.host_reads import READ_TEMP, read_form, torch_names
from dycl_jax.rewrite.converters.logical import _Logical, truth
from dycl_jax.rewrite.regions import RegionSpec, StatementSpec
from dycl_jax.rewrite.templates import (OPS, SITES, Context, const, function, locate, name, op_call, set_name, tuple_of,
                                        user_scopes)

_SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Assert)


def _has_scope_value(s: ast.stmt) -> bool:
    # a function object made inside a compiled region would close over trace-time values; the
    # lambdas our own operators take (`and`/`or` operands) are called at once and never escape
    return any(isinstance(n, (ast.Lambda, ast.Yield, ast.YieldFrom, ast.Await))
               and not getattr(n, "_dycl_generated", False) for n in ast.walk(s))


def _loads(node: ast.AST) -> list[str]:
    """Every read of a name in `node`, `x += 1` included (its target is a Store in the AST)."""
    names = [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)]
    names += [n.target.id for n in ast.walk(node) if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)]
    return names


def _table(index: int) -> ast.Subscript:
    return ast.Subscript(value=name(SITES), slice=const(index), ctx=ast.Load())


_BLOCKERS = (ast.Return, ast.Yield, ast.YieldFrom, ast.Await, ast.Global, ast.Nonlocal, ast.Try, ast.Delete,
             ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.With, ast.Raise)
_TAIL_BLOCKERS = _BLOCKERS[1:]  # a tail island ends the function: its returns are its result


def _stageable(s: ast.stmt, returns: bool = False) -> bool:
    """A compound statement that may run as one staged program: nothing leaves it early
    (no return, unless `returns`; break/continue only of loops inside it) and nothing the
    staged rewrite lacks."""
    if not isinstance(s, (ast.If, ast.For, ast.While)) or isinstance(s, ast.For) and s.orelse:
        return False
    blockers = _TAIL_BLOCKERS if returns else _BLOCKERS

    def ok(node: ast.AST, loops: int) -> bool:
        if isinstance(node, blockers) or isinstance(node, (ast.Break, ast.Continue)) and loops == 0:
            return False
        inner = loops + isinstance(node, (ast.For, ast.While))
        return all(ok(c, inner) for c in ast.iter_child_nodes(node))

    return all(ok(c, isinstance(s, (ast.For, ast.While))) for c in ast.iter_child_nodes(s))


def _simple(s: ast.stmt) -> bool:
    """A statement a region can hold."""
    return isinstance(s, _SIMPLE) and not (isinstance(s, ast.AnnAssign) and s.value is None) \
        and not _has_scope_value(s)


def _tail_start(stmts: list[ast.stmt], island: Callable[[ast.stmt], bool]) -> int | None:
    """Where the function's tail island starts: the longest suffix of the body that could stage
    with its returns (the staged rewrite makes them one exit), if it ends in `return value` and
    holds a return inside a construct, or a statement `block` would make an island of (`island`)
    before the return: there `block` would call an island and then a region for the rest, with no
    host decision between them, and one staged program costs one host call instead of several."""
    if not stmts or not isinstance(stmts[-1], ast.Return) or stmts[-1].value is None:
        return None
    k = len(stmts)
    while k > 0 and (_simple(stmts[k - 1]) or isinstance(stmts[k - 1], ast.Return) or
                     _stageable(stmts[k - 1], returns=True)):
        k -= 1
    inner = any(isinstance(n, ast.Return) for s in stmts[k:] if not isinstance(s, ast.Return) for n in ast.walk(s))
    return k if inner or any(island(s) for s in stmts[k:-1]) else None


def _first_writes(scope: ast.FunctionDef) -> dict[str, int]:
    """The first line on which each name may be bound (nested scopes included: a smaller line
    only keeps a name an island input)."""
    first: dict[str, int] = {}

    def note(n: str, line: int) -> None:
        first[n] = min(first.get(n, line), line)

    for node in ast.walk(scope):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            note(node.id, node.lineno)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node is not scope:
            note(node.name, node.lineno)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                note((a.asname or a.name).split(".")[0], node.lineno)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            note(node.name, node.lineno)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            note(node.name, node.lineno)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            note(node.rest, node.lineno)
    return first


class _Splitter:
    def __init__(self, scope: ast.FunctionDef, ctx: Context) -> None:
        self.ctx = ctx
        self.locals = set(function_locals(scope))
        self.params = param_names(scope)
        self.torch_names = torch_names(ctx)  # `torch.nonzero(x)` reads too where `torch` is torch
        a = scope.args  # the parameters in order, where every one is positional
        self.positional = None if a.vararg or a.kwonlyargs or a.kwarg else \
            tuple(p.arg for p in a.posonlyargs + a.args)
        self.reads = Counter(_loads(scope))
        self.first_write = _first_writes(scope)
        self.live = liveness(scope)
        # (statement, last line, names it updates in place) of each simple statement that updates one
        accessed = [(n, getattr(n, "end_lineno", n.lineno) or n.lineno, self._access(n)) for n in ast.walk(scope)
                    if isinstance(n, _SIMPLE)]
        # (a list method changes the list, not a tensor the alias relation joins it with)
        self.updates = [(n, line, m) for n, line, acc in accessed if (m := acc.mutates - _list_changed(n))]
        # the same, for the containers whose elements they update (`xs[0].add_(1)`, `Access.deep`)
        self.deep_updates = [(n, line, acc.deep) for n, line, acc in accessed if acc.deep]
        self.loops = 0  # host loops around the block being split: a later iteration may read a name again
        self.chunked: set[int] = set()  # `while` loops given a chunked form (rewrite/chunks.py)
        self.fused: set[int] = set()  # of them, those whose first chunk holds the statements before

    # ------------------------------------------------------------ statements

    def block(self, stmts: list[ast.stmt], islands: bool = True) -> list[ast.stmt]:
        """The host version of a block. With `islands`, a run of statements holding a stageable
        `if`/`for`/`while` is first tried as one staged island (see `_island`)."""
        out: list[ast.stmt] = []
        run: list[ast.stmt] = []

        def flush(forced: tuple[str, ...] = ()) -> None:
            if run:
                staged = islands and any(not isinstance(x, _SIMPLE) for x in run)
                out.extend(self._island(list(run), forced) if staged else self._region(list(run), forced))
                run.clear()

        skip = 0
        for i, s in enumerate(stmts):
            if skip:
                skip -= 1
                continue
            if getattr(s, "_dycl_host_call", False):  # `_c = self.sub(a)`: the sub-host runs from here
                flush()
                out.append(s)
            elif islands and _simple(s) and self._hosted_calls(s):
                flush()
                out.extend(self._island([s], (), self._hoisted(s)))
            elif islands and _stageable(s):
                run.append(s)
            elif _simple(s):
                run.append(s)
            elif isinstance(s, ast.Return) and s.value is not None:
                tmp = self._temp("ret", s, s.value, run)
                flush((tmp,))
                out.append(ast.copy_location(ast.Return(value=op_call("defined", name(tmp))), s))
            elif isinstance(s, ast.If):
                tmp = self._temp("t", s, self._test(s.test, s), run)
                flush((tmp,))
                out.append(ast.copy_location(ast.If(test=self._decide(tmp, s, "if"), body=self.block(s.body) or
                                                    [ast.Pass()], orelse=self.block(s.orelse)), s))
            elif isinstance(s, ast.While) and (post := self._around(s, run, stmts[i + 1:])) is not None:
                # the statements before and after the loop run in its chunks' programs (two
                # programs fewer per call); its host version runs them as regions, the loop chunked
                self.fused.add(id(s))
                skip = len(post)
                forced: tuple[str, ...] = ()
                ret = stmts[i + 1 + skip] if i + 1 + skip < len(stmts) else None
                if isinstance(ret, ast.Return) and ret.value is not None \
                        and self._after([locate(set_name("_", ret.value), ret)]):  # `return f(seqs)` after it
                    skip += 1
                    forced = (self._temp("ret", ret, ret.value, post),)
                out.extend(self._island([*run, s], forced, op="chunked", post=post))
                run.clear()
                if forced:
                    out.append(ast.copy_location(ast.Return(value=op_call("defined", name(forced[0]))), ret))
            elif isinstance(s, ast.While):
                flush()
                out.extend(self._while(s))
            elif isinstance(s, ast.For):
                tmp = self._temp("iter", s, s.iter, run)
                flush((tmp,))
                self.loops += 1
                body = self.block(s.body) or [ast.Pass()]
                self.loops -= 1
                out.append(ast.copy_location(ast.For(target=s.target, iter=name(tmp), body=body,
                                                     orelse=self.block(s.orelse), type_comment=None), s))
            else:
                flush()
                out.append(self._host(s))
        flush()
        return out

    def _island_ins(self, run: list[ast.stmt], acc: Access, chunked: bool = False) -> list[str]:
        """An island's inputs: what it reads, and what it writes (a path may leave a name
        unassigned), except generated temps, which exist only once assigned, and written names
        no statement before the island can have assigned (outside host loops): those are always
        unassigned there, and an argument costs time on every call. A loop run in chunks
        takes every name it writes: the next chunk starts from their values after the last."""
        written = {n for n in acc.writes if not n.startswith("_dycl_")}
        if chunked:
            return sorted(((acc.reads | acc.mutates | written) & self.locals))
        # a generated loop counter (counted_while.py) is assigned before every read of it
        counters = {n.target.id for x in run for n in ast.walk(x)
                    if isinstance(n, ast.For) and isinstance(n.target, ast.Name) and n.target.id.startswith("_dycl_")}
        if not self.loops:
            start = run[0].lineno
            # (one it reads before assigning fails to stage, and the host version then fails as Python does)
            counters |= {n for n in written - self.params if self.first_write.get(n, 0) >= start}
        return sorted(((acc.reads | acc.mutates | written) & self.locals) - counters)

    def _fusable(self, run: list[ast.stmt]) -> bool:
        """Statements before a chunked loop its first chunk's program may hold: simple ones, none
        a host read (`n = t.tolist()`: it would keep the program from staging) nor a call of a
        submodule that is a dispatch host of its own."""
        return bool(run) and all(_simple(x) and read_form(x, self.torch_names) is None and not self._hosted_calls(x)
                                 and not getattr(x, "_dycl_host_call", False) for x in run)

    def _around(self, s: ast.While, run: list[ast.stmt], rest: list[ast.stmt]) -> list[ast.stmt] | None:
        """The statements after a chunkable loop its chunks will hold (`_after`), where they or the
        statements `run` before it are some its chunks may hold; None: the loop alone."""
        if id(s) in self.fused or not self._chunkable(s) or run and not self._fusable(run):
            return None
        post = self._after(rest)
        return post if run or post else None

    def _after(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        """The statements after a chunked loop its chunks' programs may hold, up to the first that
        is not one: `_fusable` ones that update nothing in place (a chunk runs them once per exit,
        each time on the values there; an update in place would reach the names of every exit)."""
        def ok(x: ast.stmt) -> bool:
            acc = self._access(x)
            return self._fusable([x]) and not acc.mutates and not acc.deep and not _list_changed(x)
        k = next((j for j, x in enumerate(stmts) if not ok(x)), len(stmts))
        return list(stmts[:k])

    def _hosted_calls(self, s: ast.stmt) -> list[ast.Call]:
        """Calls `self.sub(...)` of a submodule that is a dispatch host of its own, outside
        anything that evaluates conditionally (where moving the call out would change what runs)."""
        found: list[ast.Call] = []

        def walk(node: ast.AST) -> None:
            if isinstance(node, (ast.Lambda, ast.IfExp, ast.BoolOp, ast.ListComp, ast.SetComp, ast.DictComp,
                                 ast.GeneratorExp)):
                return
            for child in ast.iter_child_nodes(node):
                walk(child)
            f = getattr(node, "func", None)
            if isinstance(node, ast.Call) and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
                    and f.value.id == "self" and f.attr in self.ctx.hosted \
                    and not any(isinstance(a, ast.Starred) for a in node.args) \
                    and all(k.arg is not None for k in node.keywords):
                found.append(node)

        walk(s)
        return found

    def _hoisted(self, s: ast.stmt) -> list[ast.stmt]:
        """`y = f(self.sub(g(x)))` as `_a = g(x)`, `_c = self.sub(_a)` (host program), `y = f(_c)`:
        the statements that run when `y = ...` does not stage (the sub-host's data-dependent code)."""
        s = copy.deepcopy(s)
        calls = {id(c) for c in self._hosted_calls(s)}
        pre: list[ast.stmt] = []
        splitter = self

        def temp(stem: str, value: ast.expr) -> ast.Name:
            tmp = splitter.ctx.fresh(stem)
            splitter.locals.add(tmp)
            pre.append(locate(set_name(tmp, value), s))
            return name(tmp)

        class Hoist(ast.NodeTransformer):
            def visit_Call(self, node: ast.Call) -> ast.expr:
                self.generic_visit(node)  # inner calls first: arguments are evaluated before the call
                if id(node) not in calls:
                    return node
                args = [a if isinstance(a, (ast.Name, ast.Constant)) else temp("a", a) for a in node.args]
                kws = [ast.keyword(k.arg, k.value if isinstance(k.value, (ast.Name, ast.Constant))
                                   else temp("a", k.value)) for k in node.keywords]
                result = temp("c", ast.Call(func=node.func, args=args, keywords=kws))
                pre[-1]._dycl_host_call = True  # type: ignore[attr-defined]
                return result

        rest = Hoist().visit(s)
        return [*pre, rest]

    def _island(self, run: list[ast.stmt], forced: tuple[str, ...],
                host_version: list[ast.stmt] | None = None, op: str = "island",
                post: list[ast.stmt] | None = None) -> list[ast.stmt]:
        """Try `run` as one staged program (its staged rewrite, compiled per signature); when it
        does not stage, its host version (control flow in Python, regions between; or
        `host_version`) runs instead. `op="chunked"`: `run` ends with a `while` loop (simple
        statements before it), run a few iterations per program (rewrite/chunks.py) where its
        values change shape as it goes; the simple statements `post` after it run in each chunk
        once per exit (`RegionSpec.after`)."""
        body, run = run, [*run, *(post or [])]
        acc = access(*run)
        ins = self._island_ins(run, acc, chunked=op == "chunked")
        inside = Counter(n for x in run for n in _loads(x))
        live = self._live_after(run)
        # names read after the run; where liveness is not known, those read anywhere else (a name
        # the run may write that nothing reads later is no output: an output the run may leave
        # unassigned would be an input the host may not have, `v = ...` inside an `if` of a dead `v`)
        later = live if live is not None else {n for n, c in self.reads.items() if c > inside.get(n, 0)}
        # a name read inside the run is needed again only if a host loop repeats the run
        again = set(inside) if self.loops else set()
        needed = later | again | set(forced)
        outs = sorted(n for n in acc.writes & self.locals if n in needed or n.startswith("_dycl_"))
        # a name read later that may hold a tensor the run updates in place (`a = v`, then
        # `a[0] = ...` inside): the staged island returns the updated tensor under it too, as
        # torch's `v` sees the update (its staged constructs give it the shared copy, `own`)
        aliases = getattr(self.ctx.src.tree, "_dycl_aliases", None)
        pairs: list[tuple[str, str]] = []
        if aliases is not None:
            # (a name no statement before the run can have bound holds nothing the run updates)
            others = {m for m in (needed if live is None else live) & self.locals
                      if m not in outs and not m.startswith("_dycl_")
                      and (m in self.params or self.loops or self.first_write.get(m, 0) < run[0].lineno)}
            extra = {m for m in others if any(aliases.same(m, n) for n in acc.mutates)}
            outs = sorted({*outs, *extra})
            # a name read later that may be the same tensor as an output the run may leave as it is
            pairs = [(n, m) for n in outs if n in ins for m in sorted(others - extra) if aliases.same(n, m)]
            # two outputs that may be one tensor: a staged program returns two arrays, so where a
            # later statement updates one of them in place the other would miss it; the host version
            # runs where they are one array at the call, and always where the run may bind one of
            # them to the other (`a = v` inside)
            updated = self._updated_after(run)
            kept = [(n, m) for n, m in itertools.combinations(outs, 2)
                    if not n.startswith("_dycl_") and not m.startswith("_dycl_") and aliases.same(n, m)
                    and (live is None or n in live and m in live) and any(aliases.same(u, n) for u in updated)]
            if any(n not in ins or m not in ins for n, m in kept):
                return self.block(host_version or run, islands=False)
            pairs += kept
            ins = sorted({*ins, *extra, *(m for _, m in pairs)})
        after = [self._statement(x) for x in post or []]
        # what the statements after the loop read, and the outputs they do not make: the island
        # returns them, so its loop carries those it assigns (as where the loop ends the island)
        needed, made = set(), set()
        for _, st in after:
            needed |= set(st.ins) - made
            made |= set(st.outs)
        needed = sorted((needed | set(outs) - made) & self.locals)
        fn_name = self.ctx.fresh("island")
        island = locate(function(fn_name, ins, copy.deepcopy(body), needed if post else outs), run[0])
        _stage(island, self.ctx)
        site = len(self.ctx.sites)
        first = run[0].lineno
        self.ctx.sites.append(RegionSpec(self.ctx.src.file, first,  # type: ignore[arg-type]
                                         (StatementSpec(fn_name, tuple(ins), tuple(outs), first, self.ctx.code(first)),),
                                         tuple(ins), tuple(outs), op if op == "chunked" else "island",
                                         loop_line=body[-1].lineno if op == "chunked" else 0,
                                         after=tuple(st for _, st in after),
                                         aliased=tuple((ins.index(n), ins.index(m)) for n, m in pairs),
                                         in_place=frozenset(set(ins) & set(outs) - rebound(run)),
                                         updated_later=self._updated_after(run),
                                         deep_later=self._updated_after(run, deep=True)))
        resume: list[ast.stmt] = []
        if op == "chunked" and len(body) > 1:  # statements, then the loop: its later chunks take the loop alone
            loop = body[-1]
            names = sorted({*self._island_ins([loop], access(loop), chunked=True), *needed} & self.locals)
            resume = [locate(function(self.ctx.fresh("island"), names, [copy.deepcopy(loop)], needed), loop)]
            _stage(resume[0], self.ctx)
            self.ctx.sites[site] = dataclasses.replace(self.ctx.sites[site], resume=tuple(names))  # type: ignore[arg-type]
        result = self.ctx.fresh("staged")
        self.locals.add(result)
        args = [_table(site), name(fn_name), tuple_of(ins)]
        if post:
            args += [name(resume[0].name) if resume else const(None),
                     ast.Tuple(elts=[name(fn.name) for fn, _ in after], ctx=ast.Load())]
        elif resume:
            args.append(name(resume[0].name))
        call = set_name(result, op_call(op, *args))
        host = self._host_version(host_version or run)
        unpack = [ast.Assign(targets=[tuple_of(outs, store=True)], value=name(result))] if outs else [ast.Pass()]
        test = ast.Compare(left=name(result), ops=[ast.Is()],
                           comparators=[ast.Attribute(value=name(OPS), attr="NOT_STAGED", ctx=ast.Load())])
        return locate([island, *resume, *(fn for fn, _ in after), call,
                       ast.If(test=test, body=host or [ast.Pass()], orelse=unpack)], run[0])

    def _host_version(self, run: list[ast.stmt]) -> list[ast.stmt]:
        """An island's host version: its statements split into regions and host decisions (those
        nested inside may still be islands), save that the statements after its last host read
        (`n = t.tolist()`, `.item()`, `.nonzero()`: what kept it from staging, most often) are
        tried again as an island of their own, taking the values read as inputs: a loop over
        `range(max(lengths))` stages unrolled for the lengths it is given."""
        last = max((i for i, x in enumerate(run) if _simple(x) and read_form(x, self.torch_names) is not None),
                   default=None)
        if last is None or all(isinstance(x, _SIMPLE) for x in run[last + 1:]):
            return self.block(run, islands=False)
        return self.block(run[:last + 1], islands=False) + self.block(run[last + 1:])

    def function_body(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        """The host version of the function's body, its tail (see `_tail_start`) tried as one island."""
        k = _tail_start(stmts, lambda s: _stageable(s) or _simple(s) and bool(self._hosted_calls(s)))
        if k is None:
            return self.block(stmts)
        return self.block(stmts[:k]) + self._tail_island(stmts[k:], whole=k == 0)

    def _tail_island(self, run: list[ast.stmt], whole: bool = False) -> list[ast.stmt]:
        """`run` ends the function: staged whole, returns included, its result is the function's
        (`return island(...)[0]`); when it does not stage, its host version runs instead. `whole`:
        `run` is the function's entire body."""
        ins = self._island_ins(run, access(*run))
        fn_name, wrapper, ret = self.ctx.fresh("island"), self.ctx.fresh("tail"), self.ctx.fresh("ret")
        island = locate(function(fn_name, ins, copy.deepcopy(run), None), run[0])
        _stage(island, self.ctx)
        # regions return tuples of their outputs: the wrapper gives the island's result as one
        call = ast.Call(func=name(fn_name), args=[name(n) for n in ins], keywords=[])
        outer = locate(function(wrapper, ins, [ast.Return(value=ast.Tuple(elts=[call], ctx=ast.Load()))], None), run[0])
        site = len(self.ctx.sites)
        first = run[0].lineno
        self.ctx.sites.append(RegionSpec(self.ctx.src.file, first,  # type: ignore[arg-type]
                                         (StatementSpec(wrapper, tuple(ins), (ret,), first, self.ctx.code(first)),),
                                         tuple(ins), (ret,), "island", tail=True))
        if whole and self.positional is not None and set(ins) <= set(self.positional):
            self.ctx.whole = (self.ctx.sites[site], self.positional)
        result = self.ctx.fresh("staged")
        self.locals.add(result)
        staged_call = set_name(result, op_call("island", _table(site), name(wrapper), tuple_of(ins)))
        host = self.block(run)
        test = ast.Compare(left=name(result), ops=[ast.Is()],
                           comparators=[ast.Attribute(value=name(OPS), attr="NOT_STAGED", ctx=ast.Load())])
        # (a name the staged version returns unassigned fails here, as in Python)
        done = ast.Return(value=op_call("defined", ast.Subscript(value=name(result), slice=const(0), ctx=ast.Load())))
        return locate([island, outer, staged_call, ast.If(test=test, body=host or [ast.Pass()], orelse=[done])], run[0])

    def _host(self, s: ast.stmt) -> ast.stmt:
        """A statement that runs on the host as written; compound ones get split bodies."""
        if isinstance(s, (ast.With, ast.Try)):
            s.body = self.block(s.body) or [ast.Pass()]
            if isinstance(s, ast.Try):
                for h in s.handlers:
                    h.body = self.block(h.body) or [ast.Pass()]
                s.orelse = self.block(s.orelse)
                s.finalbody = self.block(s.finalbody)
        return s

    def _chunkable(self, s: ast.While) -> bool:
        """A `while` the host may run in chunks of iterations (rewrite/chunks.py): one that stages
        (`_stageable`), without `else` (its staged form ends with the loop, which the chunk
        unrolls), in no host loop, and calling no submodule that is a dispatch host itself."""
        return id(s) not in self.chunked and not s.orelse and not self.loops and _stageable(s) \
            and not any(self._hosted_calls(x) for x in ast.walk(s) if isinstance(x, _SIMPLE))

    def _while(self, s: ast.While) -> list[ast.stmt]:
        if self._chunkable(s):
            self.chunked.add(id(s))  # (its host version, below, is this loop as a host loop)
            return self._island([s], (), op="chunked")
        # while test: body [else: tail]  ==>  while True: _t = test; if not _t: [_else = True;] break; body
        # (`while True:` / `while 1:` stays as it is: a region for a constant would cost a call per iteration)
        always = isinstance(s.test, ast.Constant) and bool(s.test.value)
        tmp = self.ctx.fresh("t")
        self.locals.add(tmp)
        test_region = [] if always else self._region([locate(set_name(tmp, self._test(s.test, s)), s)], (tmp,))
        stop: list[ast.stmt] = [ast.Break()]
        pre: list[ast.stmt] = []
        post: list[ast.stmt] = []
        if s.orelse and not always:  # (the else of `while True:` never runs)
            flag = self.ctx.fresh("else")
            self.locals.add(flag)
            pre = [set_name(flag, const(False))]
            stop = [set_name(flag, const(True)), ast.Break()]
            post = [ast.If(test=name(flag), body=self.block(s.orelse), orelse=[])]
        check = [] if always else \
            [ast.If(test=ast.UnaryOp(op=ast.Not(), operand=self._decide(tmp, s, "while")), body=stop, orelse=[])]
        self.loops += 1
        body = self.block(s.body)
        self.loops -= 1
        loop = ast.While(test=const(True), body=[*test_region, *check, *body] or [ast.Pass()], orelse=[])
        return locate([*pre, loop, *post], s)

    # ------------------------------------------------------------ helpers

    def _temp(self, stem: str, s: ast.stmt, value: ast.expr, run: list[ast.stmt]) -> str:
        tmp = self.ctx.fresh(stem)
        self.locals.add(tmp)
        run.append(locate(set_name(tmp, value), s))
        run[-1]._dycl_before = s  # type: ignore[attr-defined]  (what is live after it: see _live_after)
        return tmp

    def _kept_by_update(self, s: ast.stmt, acc: Access, outs: list[str]) -> set[str]:
        """Names besides `outs` that statement `s` of a region must also return, as they are at
        the call, since they may hold the tensor it updates in place and are read after it."""
        aliases = getattr(self.ctx.src.tree, "_dycl_aliases", None)
        if aliases is None or not acc.mutates:
            return set()
        live = self.live.following(s)
        return {m for m in (self.locals if live is None else live & self.locals)
                if m not in outs and not m.startswith("_dycl_") and any(aliases.same(m, u) for u in acc.mutates)
                and (m in self.params or self.loops or self.first_write.get(m, 0) < s.lineno)}

    def _access(self, s: ast.stmt) -> Access:
        """`access(s)`, where a helper it calls may also update an argument in place: a region
        statement returns it, so the update reaches the name (the host holds arrays; a name not
        returned would keep the old one)."""
        acc = access(s)
        acc.mutates |= helper_arguments(s) & acc.reads & self.locals
        return acc

    def _updated_after(self, run: list[ast.stmt], deep: bool = False) -> frozenset[str] | None:
        """Names that may hold a tensor a simple statement outside `run` and after its start
        updates in place (inside a host loop, any statement); with `deep`, a container whose
        elements it updates in place. None where the function's aliases are not known. (The run's
        own updates are one program's: its outputs hold them, a view of an updated tensor too.)"""
        inside = {id(n) for st in run for n in ast.walk(st)}
        # from the run's first line: a temp holding an `if`/`while` test or a `for` iterable is
        # located at its whole statement, whose body runs after the run
        start = min(st.lineno for st in run)
        updates = self.deep_updates if deep else self.updates
        return self._aliased({n for node, line, names in updates
                              if self.loops or id(node) not in inside and line >= start for n in names})

    def _aliased(self, names: set[str]) -> frozenset[str] | None:
        """The function's names that may hold a tensor one of `names` holds (None: not known)."""
        aliases = getattr(self.ctx.src.tree, "_dycl_aliases", None)
        if aliases is None:
            return None
        return frozenset(m for m in self.locals if any(aliases.same(m, u) for u in names))

    def _live_after(self, run: list[ast.stmt]) -> set[str] | None:
        """Names read after the run (None: not known). A temp computed for a statement (its test,
        its return value) is followed by that statement: what is live before it, a superset."""
        before = getattr(run[-1], "_dycl_before", None)
        if isinstance(before, ast.Return):  # the function ends there: only the value's temp is read
            return set()
        return self.live.following(run[-1]) if before is None else self.live.before(before)

    @staticmethod
    def _test(test: ast.expr, s: ast.stmt) -> ast.expr:
        # only truthiness is used, so `and`/`or`/`not` may become logical ops on tensors
        if getattr(s, "_dycl_static", False):
            return test
        return locate(_Logical().visit(truth(test)), s)

    def _unbind(self, ins: list[str]) -> list[ast.stmt]:
        """`if type(n) is Undefined: del n` for inputs that may be unassigned on this path, so a
        read of one fails exactly as in Python (UnboundLocalError) instead of passing a placeholder on."""
        out: list[ast.stmt] = []
        for n in ins:
            if n in self.params or n.startswith("_dycl_"):
                continue
            test = ast.Compare(left=ast.Call(func=name("type"), args=[name(n)], keywords=[]), ops=[ast.Is()],
                               comparators=[ast.Attribute(value=name(OPS), attr="Undefined", ctx=ast.Load())])
            out.append(ast.If(test=test, body=[ast.Delete(targets=[name(n, store=True)])], orelse=[]))
        for d in out:
            d.body[0].targets[0].ctx = ast.Del()
        return out

    def _decide(self, tmp: str, s: ast.stmt, kind: str) -> ast.expr:
        if getattr(s, "_dycl_static", False):
            return name(tmp)
        site = self.ctx.add_site(kind, s.lineno, (), (), ())
        return op_call("decide", name(tmp), _table(site))

    def _statement(self, s: ast.stmt) -> tuple[ast.FunctionDef, StatementSpec]:
        """`def _dycl_s_k(ins): s; return outs` for a simple statement, and its description."""
        acc = self._access(s)
        reads = set(acc.reads | acc.mutates)
        if isinstance(s, ast.AugAssign) and isinstance(s.target, ast.Name):
            reads.add(s.target.id)
        ins = sorted(reads & self.locals)
        outs = sorted(acc.writes & self.locals)
        # the other names read later that may hold the tensor it updates in place pass through
        # it: where one is that tensor at the call the region takes them as one and returns the
        # updated tensor under each, as torch's names see the update (a placeholder passes as is)
        also = self._kept_by_update(s, acc, outs)
        plain = ins  # (read by the statement: unassigned, it fails as in Python)
        ins, outs = sorted({*ins, *also}), sorted({*outs, *also})
        fn_name = self.ctx.fresh("s")
        fn = locate(function(fn_name, ins, [*self._unbind(plain), s], outs), s)
        return fn, StatementSpec(fn_name, tuple(ins), tuple(outs), s.lineno, self.ctx.code(s.lineno),
                                 appended(s), tuple(sorted(rebound([s]) & set(outs))), copied(s),
                                 read_form(s, self.torch_names), self._aliased(acc.mutates - _list_changed(s)),
                                 self._aliased(acc.deep), tuple(sorted(also - set(plain))))

    def _region(self, run: list[ast.stmt], forced: tuple[str, ...]) -> list[ast.stmt]:
        """`def _dycl_s_k(ins): stmt; return outs` per statement, then one `region` call."""
        stmts: list[StatementSpec] = []
        defs: list[ast.stmt] = []
        defined: set[str] = set()
        exposed: list[str] = []
        run_reads: Counter = Counter()
        for s in run:
            fn, st = self._statement(s)
            run_reads.update(_loads(s))
            exposed += [n for n in st.ins if n not in defined and n not in exposed]
            defined |= set(st.outs)
            defs.append(fn)
            stmts.append(st)
        elsewhere = {n for n, c in self.reads.items() if c > run_reads.get(n, 0)}
        # generated temps (tests, iterables, return values) are read by the host code after the region
        outs = sorted(n for n in defined if n in elsewhere or n in exposed or n in forced
                      or n.startswith("_dycl_") and not n.startswith(READ_TEMP))
        live = self._live_after(run)
        spec = RegionSpec(self.ctx.src.file, run[0].lineno, tuple(stmts), tuple(exposed), tuple(outs),
                          live_after=None if live is None else frozenset(live),
                          in_place=frozenset(set(exposed) & set(outs) - rebound(run)),
                          updated_later=self._updated_after(run),
                          deep_later=self._updated_after(run, deep=True))
        self.ctx.sites.append(spec)  # type: ignore[arg-type]  (generated code reads specs from the site table)
        call = op_call("region", _table(len(self.ctx.sites) - 1),
                       ast.Tuple(elts=[name(st.fn) for st in stmts], ctx=ast.Load()),
                       tuple_of(list(exposed)))
        target: ast.stmt = ast.Assign(targets=[tuple_of(outs, store=True)], value=call) if outs else ast.Expr(call)
        return locate([*defs, target], run[0])


_LIST_METHODS = frozenset({"append", "extend", "insert", "pop", "remove", "clear", "reverse", "sort"})


def _list_changed(s: ast.stmt) -> set[str]:
    """`xs` of `xs.append(v)` (a statement that is one list-method call): the list changes, no
    tensor does (`xs.append(v.add_(1))` still updates `v`: only the receiver is left out)."""
    call = s.value if isinstance(s, ast.Expr) else None
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in _LIST_METHODS \
            and isinstance(call.func.value, ast.Name):
        return {call.func.value.id}
    return set()


def _stage(island: ast.FunctionDef, ctx: Context) -> None:
    """Run the staged pipeline (from the stages after those already applied) on an island."""
    from dycl_jax.rewrite.pipeline import PIPELINE  # the pipeline module imports this one

    sub = Context(dataclasses.replace(ctx.src, tree=island), ctx.sites, ctx.warnings, ctx.helpers,
                  counter=ctx.counter, files=ctx.files)
    island._dycl_aliases = getattr(ctx.src.tree, "_dycl_aliases", None)  # type: ignore[attr-defined]  (the method's names)
    scopes = user_scopes(island)[::-1]
    for scope in scopes:
        scope._dycl_user_locals = function_locals(scope)  # type: ignore[attr-defined]
    # (self_attributes: the method's own attributes are its locals already; those left are read elsewhere)
    done = {"super_calls", "side_effects", "self_attributes", "attribute_stores", "helpers"}
    for stage, convert_scope in PIPELINE:
        if stage not in done:
            for scope in scopes:
                convert_scope(scope, sub)
    ctx.counter = sub.counter


def convert(scope: ast.FunctionDef, ctx: Context) -> None:
    if scope is not ctx.src.tree:
        return  # nested user functions run as written, inside units or on the host
    params = param_names(scope)
    body = _Splitter(scope, ctx).function_body(scope.body)
    # regions take their inputs as arguments: a name still unassigned on this path (read only
    # behind a short-circuit, say) is passed as an Undefined that fails only if it is used
    # (a read's temp too: an island taking the names its construct reads may list it)
    unset = sorted(n for n in function_locals(scope) - params if not n.startswith("_dycl_") or n.startswith(READ_TEMP))
    init = [locate(set_name(n, op_call("Undefined", const(n))), scope) for n in unset]
    scope.body = [*init, *body] or [ast.Pass()]

