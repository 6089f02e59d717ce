"""Integration hook: rewrite a model method (and what it reaches) and patch it in, on the instances."""
from __future__ import annotations

import ast
import contextlib
import copy
import inspect
import linecache
import dataclasses
import types
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch

from dycl_jax.analysis import effects
from dycl_jax.analysis.closures import closure_hazards, stale_after_rebind
from dycl_jax.errors import DyclError, limitation
from dycl_jax.analysis.dynamism import constructs, needs_rewrite
from dycl_jax.analysis.scopes import function_locals
from dycl_jax.rewrite import codegen, library_root, lifting, padding, pipeline
from dycl_jax.rewrite.converters import bounded_rows, host_values
from dycl_jax.rewrite.modes import exclusive
from dycl_jax.rewrite.operators import staging, tracing  # noqa: F401  (re-exported for the capture stage)
from dycl_jax.rewrite.templates import Context, user_scopes
from dycl_jax.source import discover as disc
from dycl_jax.source.reader import read_function, unwrap


class RewriteWarning(UserWarning):
    """Something of the user's code is not kept in the rewritten version."""


class SideEffectWarning(RewriteWarning):
    """A statement was dropped from rewritten code because it does not affect the outputs."""


@dataclass(frozen=True)
class SiteRecord:
    kind: str  # if | elif | while | ifexp | guard (rewritten) — static ones keep kind if/while/ifexp
    label: str  # e.g. "if@model.py:12"
    line: int
    static: bool = False  # provably Python: left as a plain Python statement


@dataclass
class FunctionRecord:
    name: str  # qualified name of the user function
    file: str
    line: int
    generated: str  # filename of the generated code (in linecache)
    sites: list[SiteRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    patched: list[str] = field(default_factory=list)  # "Block.forward on blocks.0", ...
    unrolled: list[str] = field(default_factory=list)  # loops unrolled for max_len (decode_loops.py)

    @property
    def source(self) -> str:
        return "".join(linecache.getlines(self.generated))


@dataclass
class RewriteRecord:
    model: str
    method: str
    functions: list[FunctionRecord] = field(default_factory=list)

    def function(self, name: str) -> FunctionRecord:
        return next(f for f in self.functions if f.name == name or f.name.endswith("." + name))


@dataclass
class _Rewritten:
    fn: types.FunctionType
    record: FunctionRecord


_CACHE: dict[tuple, _Rewritten] = {}


@dataclass(frozen=True)
class UnrollOption:
    """`to_jax(..., max_len=N)`: the converted method's decode loop runs at most N iterations.
    `natural`: chosen by `host="auto"`, not the user: the loop must end by its own test within
    the N iterations (a Python bound such as `step >= max_len`, the items of a `for`), else
    the conversion is refused (padding.Unroll.cut) and auto runs the method on the dispatch host."""

    max_len: int
    natural: bool = False


def _rewrite(fn: types.FunctionType, helper_cells: dict[str, types.CellType], upto: str | None = None,
             dispatch: bool = False, unroll: UnrollOption | None = None, hosted: frozenset = frozenset(),
             calls: tuple[effects.CallEffects, effects.CallEffects] = ((), ()),
             files: frozenset = frozenset(), root: bool = False, registered: frozenset = frozenset()) -> _Rewritten:
    key = (fn.__code__, id(fn.__globals__), tuple(sorted((k, id(v)) for k, v in helper_cells.items())), upto,
           dispatch, unroll, hosted, calls, files, root, registered)
    if key in _CACHE:
        return _CACHE[key]
    src = read_function(fn)
    for hazard in closure_hazards(src.tree):
        if hazard.refreshable and not dispatch:
            continue  # defined again inside the construct (converters/closure_refresh.py)
        message = (f"nested function `{hazard.function}` reads `{hazard.variable}`, which the construct at line "
                   f"{hazard.construct_line} reassigns and also calls `{hazard.function}` inside; once that construct "
                   f"is converted its body runs as a separate function, so `{hazard.function}` would see the old "
                   f"`{hazard.variable}`")
        if hazard.refreshable:  # the dispatch rewrite: a region takes a closure's cells when it starts
            raise DyclError(message + f", and on the dispatch host a compiled region takes `{hazard.function}`'s "
                            "values when it starts", location=src.location(hazard.line),
                            fix=f'convert with host="auto" (the default) or host="staged": they define '
                                f'`{hazard.function}` again inside the converted body')
        raise DyclError(
            message + f", and `{hazard.function}` cannot be defined again there (a decorator, a default, `nonlocal`, "
            "a second definition or a call of itself)",
            location=src.location(hazard.line),
            fix=limitation(f"`{hazard.function}` would read `{hazard.variable}` from the function's scope while the "
                           "converted construct holds its new value; every host rewrites the construct so",
                           "dycl_jax/analysis/closures.py, read by rewrite/api.py"),
        )
    for hazard in stale_after_rebind(src.tree) if dispatch else ():
        raise DyclError(
            f"nested function `{hazard.function}` reads `{hazard.variable}`, which line {hazard.construct_line} "
            f"reassigns before `{hazard.function}` is used again; on the dispatch host a compiled region takes "
            f"`{hazard.function}`'s values when it starts, so it could see the old `{hazard.variable}`",
            location=src.location(hazard.line),
            fix=limitation(f"`{hazard.function}` would read a stale `{hazard.variable}` on the dispatch host",
                           "dycl_jax/analysis/closures.py, read by rewrite/api.py",
                           alternative='host="staged" converts it where the program has no data-dependent shapes'),
        )
    original = copy.deepcopy(src.tree)
    first = src.tree.args.posonlyargs + src.tree.args.args
    effects.mark(src.tree, calls[0], calls[1], first[0].arg if calls[0] and first else None)
    ctx = Context(src, helpers=helper_cells, unroll=unroll, hosted=hosted, files=files, root=root, registered=registered)
    tree = pipeline.run(ctx, upto, dispatch=dispatch)
    new_fn, filename, _ = codegen.build(ctx, tree)
    if ctx.whole is not None:
        new_fn.__dycl_whole__ = ctx.whole  # type: ignore[attr-defined]  (host/dispatch.py's direct call)
    record = FunctionRecord(fn.__qualname__, src.file, src.line, filename, warnings=list(ctx.warnings),
                            unrolled=list(ctx.unrolled))
    for site in ctx.sites:
        if site.kind not in ("region", "island"):
            record.sites.append(SiteRecord(site.kind, site.label, site.line))
    for scope in user_scopes(original):
        for c in constructs(scope, function_locals(scope)):
            if c.static and c.kind in ("if", "while", "ifexp"):
                record.sites.append(SiteRecord(c.kind, f"{c.kind}@{src.file.rsplit('/', 1)[-1]}:{c.line}", c.line,
                                               static=True))
    for line in src.dropped_decorators:
        record.warnings.append(f"{src.file.rsplit('/', 1)[-1]}:{line}: the decorator is not applied to the "
                               f"rewritten {fn.__qualname__}")
    done = _Rewritten(new_fn, record)
    _CACHE[key] = done
    return done


def _referenced(fn: types.FunctionType, rewritten: dict[types.FunctionType, Any]) -> dict[str, types.FunctionType]:
    """Names by which `fn` refers to helper functions that are rewritten."""
    names = {}
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    for name in disc.code_names(fn.__code__) | set(cells):
        try:
            value = cells[name].cell_contents if name in cells else fn.__globals__.get(name)
        except ValueError:
            continue
        if isinstance(value, types.FunctionType) and value in rewritten:
            names[name] = value
    return names


class _Effects:
    """What the user methods and functions a rewritten function calls do to their arguments
    (`analysis/effects.py`), found as Python would call them on these instances: `self.same(v)`
    (a user method: its body is read), `self.block(h)` (a submodule: its forward, if it is user
    code; a torch layer only where it is built with `inplace=True`), `bump(v)` (a user function).
    One per plan: a function's summary depends on the instance it is bound to."""

    DEPTH = 4  # calls followed from a rewritten function (a recursive method stops there)

    def __init__(self) -> None:
        self._memo: dict[tuple[types.FunctionType, int], effects.Effects | None] = {}

    def calls(self, fn: types.FunctionType, owners: Sequence[Any], depth: int = 0
              ) -> tuple[effects.CallEffects, effects.CallEffects]:
        """(methods of `self`, functions by name) that `fn` may call, bound to each of `owners`."""
        names = sorted(disc.code_names(fn.__code__))
        methods: dict[str, set[effects.Effects]] = {}
        for owner in owners:
            for n in names:
                member = self._member(owner, n)
                found = self._of(member, owner, depth)
                if found:
                    methods.setdefault(n, set()).add(found)
                if isinstance(member, (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)):
                    # `self.blocks[i](h)`, `for blk in self.blocks: blk(h)`: any element's forward may run
                    for element in member.children():
                        found = self._of(element, member, depth)
                        if found:
                            methods.setdefault(effects.element_key(n), set()).add(found)
        functions: dict[str, set[effects.Effects]] = {}
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        for n in sorted(set(names) | set(cells)):
            try:
                value = cells[n].cell_contents if n in cells else fn.__globals__.get(n)
            except ValueError:  # (an empty cell)
                continue
            found = self._of(value, None, depth) if isinstance(value, types.FunctionType) else None
            if found:
                functions.setdefault(n, set()).add(found)
        return (tuple((n, tuple(sorted(e, key=repr))) for n, e in sorted(methods.items())),
                tuple((n, tuple(sorted(e, key=repr))) for n, e in sorted(functions.items())))

    @staticmethod
    def _member(owner: Any, n: str) -> Any:
        """`owner.<n>` where it is a submodule or a function of the class (no property runs)."""
        if isinstance(owner, torch.nn.Module) and n in owner._modules:
            return owner._modules[n]
        static = inspect.getattr_static(type(owner), n, None)
        return static if isinstance(static, (types.FunctionType, staticmethod, classmethod)) else None

    def _of(self, value: Any, owner: Any, depth: int) -> effects.Effects | None:
        if isinstance(value, torch.nn.Module):
            forward = getattr(type(value), "forward", None)
            if isinstance(forward, types.FunctionType) and not disc.is_library(forward):
                return self._summary(forward, value, 1, depth)
            return effects.IN_PLACE_MODULE if getattr(value, "inplace", False) is True else None
        if isinstance(value, staticmethod):
            return self._of(value.__func__, None, depth)
        if isinstance(value, classmethod):
            return self._summary(value.__func__, None, 1, depth) \
                if isinstance(value.__func__, types.FunctionType) else None
        if isinstance(value, types.FunctionType):
            return self._summary(value, owner, 1 if owner is not None else 0, depth)
        return None

    def _summary(self, fn: types.FunctionType, owner: Any, skip: int, depth: int) -> effects.Effects | None:
        if disc.is_library(fn) or fn.__name__ == "<lambda>" or depth >= self.DEPTH:
            return None
        key = (fn, id(owner))
        if key not in self._memo:
            self._memo[key] = None  # (a recursive call: unknown while it is summarized)
            try:
                tree = read_function(fn).tree
            except DyclError:
                return None  # its source cannot be read: nothing is known of its effects, as before
            calls = self.calls(fn, [owner] if owner is not None else [], depth + 1)
            args = tree.args.posonlyargs + tree.args.args
            effects.mark(tree, *calls, args[0].arg if owner is not None and args else None)
            self._memo[key] = effects.summarize(tree, skip)
        return self._memo[key]


def _owners(fn: types.FunctionType, targets: Sequence[disc.Target]) -> list[Any]:
    """The instances `fn` runs bound to (as a method)."""
    return [t.bound for t in targets if t.fn is fn and t.binding == "method"]


def _reads_data(tree: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "data" and isinstance(n.ctx, ast.Load) for n in ast.walk(tree))


def _plan(model: torch.nn.Module, method: str, unroll: UnrollOption | None = None
          ) -> tuple[list[disc.Target], dict[types.FunctionType, _Rewritten], dict[types.FunctionType, types.CellType]]:
    targets, helpers = disc.discover(model, method)
    top = {t.fn for t in targets if t.owner is model and t.attr == method} if unroll else set()
    functions = {t.fn for t in targets} | {h.fn for h in helpers}
    for fn in functions:  # user frames stay in export's stack traces (node → user line)
        codegen.keep_frames(fn.__code__)
    dynamic: set[types.FunctionType] = set()
    for fn in functions:  # source is read only for code that branches or reads `.data`
        if fn in top or (disc.has_branching(fn.__code__) and needs_rewrite(read_function(fn).tree)):
            dynamic.add(fn)
        elif bounded_rows.may_apply(fn.__code__) and bounded_rows.applies(read_function(fn).tree):
            dynamic.add(fn)  # row writes through a selection (`if sel.numel() > 0:` is static)
        elif "data" in disc.code_names(fn.__code__) and _reads_data(read_function(fn).tree):
            dynamic.add(fn)  # torch.export cannot trace `.data`; the rewrite makes it `.detach()`
        elif host_values.may_apply(disc.code_names(fn.__code__)) and host_values.applies(read_function(fn).tree):
            dynamic.add(fn)  # `np.argmax([c.item() ...])`: the rewrite keeps the items tensors
    helper_fns = {h.fn for h in helpers}
    changed = True
    while changed:  # callers of rewritten helpers are rewritten too, to call the new version
        changed = False
        for fn in functions - dynamic:
            if _referenced(fn, {h: None for h in dynamic & helper_fns}):
                dynamic.add(fn)
                changed = True
    cells = {h: types.CellType() for h in dynamic & helper_fns}
    files = model_files(model, functions)
    roots = _roots(model, method, targets)
    done: dict[types.FunctionType, _Rewritten] = {}
    known = _Effects()
    for fn in dynamic:
        refs = _referenced(fn, cells)
        done[fn] = _rewrite(fn, {name: cells[h] for name, h in refs.items()}, unroll=unroll if fn in top else None,
                            calls=known.calls(fn, _owners(fn, targets)), files=files, root=fn in roots,
                            registered=_registered(fn, targets))
    for h, cell in cells.items():
        cell.cell_contents = done[h].fn
    return [t for t in targets if t.fn in done], done, cells


def _bind(target: disc.Target, fn: types.FunctionType) -> Any:
    if target.binding in ("method", "class"):
        return types.MethodType(fn, target.bound)
    return fn


@contextlib.contextmanager
def rewritten(model: torch.nn.Module, method: str = "forward", unroll: UnrollOption | None = None
              ) -> Iterator[RewriteRecord]:
    """Patch `model.<method>` and every user method it reaches with its rewritten version
    (on these instances only, restored on exit); yields what was rewritten. With `unroll`,
    the method's decode loop is unrolled (converters/decode_loops.py)."""
    if not callable(getattr(model, method, None)):
        raise DyclError(f"{type(model).__name__} has no method {method!r}", fix="pass method=<name of a method>")
    targets, done, _ = _plan(model, method, unroll)
    names = {id(m): n or "<model>" for n, m in model.named_modules()}
    record = RewriteRecord(type(model).__name__, method)
    records = {fn: dataclasses.replace(rw.record, sites=list(rw.record.sites), warnings=list(rw.record.warnings),
                                       patched=[], unrolled=list(rw.record.unrolled)) for fn, rw in done.items()}
    record.functions = list(records.values())
    saved: list[tuple[Any, str, bool, Any]] = []
    try:
        for target in targets:
            owner_dict = target.owner.__dict__
            saved.append((target.owner, target.attr, target.attr in owner_dict, owner_dict.get(target.attr)))
            owner_dict[target.attr] = _bind(target, done[target.fn].fn)
            where = names.get(id(target.owner), type(target.owner).__name__)
            records[target.fn].patched.append(f"{target.attr} on {where}")
        for r in record.functions:
            for w in r.warnings:
                category = SideEffectWarning if "dropped `" in w else RewriteWarning
                warnings.warn(w, category, stacklevel=3)
        with lifting.lifted(model):
            yield record
    finally:
        for owner, attr, had, old in reversed(saved):
            if had:
                owner.__dict__[attr] = old
            else:
                owner.__dict__.pop(attr, None)


@exclusive
def run_torch_trace(model: torch.nn.Module, method: str, args: Any,
                    unroll: UnrollOption | None = None) -> tuple[Any, list[tuple[str, Any]]]:
    """Run the rewritten program eagerly, recording every decision (site, value).

    Runs in eval mode without gradients, like capture. Values the staged program would hold as
    tensors are tensors here too, so the decision list is the one the staged program makes.
    `unroll`: rewritten as a padded model was (`jm.unroll`); the output is trimmed to exact values.
    """
    args = args if isinstance(args, tuple) else (args,)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), rewritten(model, method, unroll), tracing() as decisions:
            out = getattr(model, method)(*args)
    finally:
        model.train(was_training)
    return (out if unroll is None else padding.exact(out)), decisions


def rewrite_function(fn: Any, upto: str | None = None, dispatch: bool = False) -> types.FunctionType:
    """The rewritten version of one function or method (no helper substitution, no patching);
    `upto` stops after that converter of the pipeline (for testing one converter at a time);
    `dispatch` selects the dispatch host's pipeline."""
    return _rewrite(unwrap(fn), {}, upto, dispatch).fn


# ---------------------------------------------------------------- the dispatch host's two rewrites

Binding = tuple[Any, str, Any]  # (owner, attribute, value to set on the instance)


class patched:
    """Set instance attributes (methods) for the duration; restored on exit, innermost first.
    A class, not a generator: the dispatch host enters it on every call."""

    __slots__ = ("bindings", "saved")

    def __init__(self, bindings: list[Binding]) -> None:
        self.bindings = bindings

    def __enter__(self) -> None:
        self.saved: list[tuple[dict, str, bool, Any]] = []
        try:
            for owner, attr, value in self.bindings:
                d = owner.__dict__
                self.saved.append((d, attr, attr in d, d.get(attr)))
                d[attr] = value
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        for d, attr, had, old in reversed(self.saved):
            if had:
                d[attr] = old
            else:
                d.pop(attr, None)


@dataclass
class DispatchPlan:
    """What the dispatch host patches in: the staged rewrite (used inside compiled regions) and
    the dispatch rewrite (host control flow around regions) of every user method it reaches."""

    staged: list[Binding]
    dispatch: list[tuple[disc.Target, types.FunctionType]]  # unbound dispatch versions
    record: RewriteRecord

    @staticmethod
    def bind(target: disc.Target, fn: Any) -> Binding:
        return (target.owner, target.attr, _bind(target, fn))


def model_files(model: torch.nn.Module, functions: Any) -> frozenset[str]:
    """The source files of the model's module classes (and their bases) and of `functions`: where
    code that reads a module's attributes may live."""
    found = {fn.__code__.co_filename for fn in functions}
    for cls in {type(m) for m in model.modules()}:
        for base in cls.__mro__:
            if base.__module__.startswith("torch."):
                continue
            try:
                found.add(inspect.getsourcefile(base) or "")
            except TypeError:  # a builtin base
                continue
    return frozenset(f for f in found if f and not f.startswith("<"))


def _registered(fn: types.FunctionType, targets: Sequence[disc.Target]) -> frozenset[str]:
    """Names of the parameters, buffers and submodules of the modules `fn` runs bound to."""
    return frozenset(k for o in _owners(fn, targets) if isinstance(o, torch.nn.Module)
                     for k in (*o._parameters, *o._buffers, *o._modules))


def _roots(model: torch.nn.Module, method: str, targets: Sequence[disc.Target]) -> set[types.FunctionType]:
    """The converted method's function, where nothing else the model reaches runs it too: it runs
    once per call (a method of several instances, or a helper, may run several times)."""
    return {t.fn for t in targets if t.owner is model and t.attr == method
            and sum(u.fn is t.fn for u in targets) == 1}


def dispatch_plan(model: torch.nn.Module, method: str = "forward") -> DispatchPlan:
    """Rewrite `model.<method>` and every user method it reaches that branches, for the dispatch host."""
    if not callable(getattr(model, method, None)):
        raise DyclError(f"{type(model).__name__} has no method {method!r}", fix="pass method=<name of a method>")
    staged_targets, staged_done, cells = _plan(model, method)
    targets, _ = disc.discover(model, method)
    record = RewriteRecord(type(model).__name__, method)
    dispatch: list[tuple[disc.Target, types.FunctionType]] = []
    chosen = [t for t in targets if t.owner is model and t.attr == method  # always a host program
              or disc.has_branching(t.fn.__code__) and not inspect.isgeneratorfunction(t.fn)]
    if not any(t.owner is model and t.attr == method for t in chosen):
        chosen.insert(0, _library_root(model, method))
    hosts = {id(t.owner) for t in chosen if t.attr == "forward" and isinstance(t.owner, torch.nn.Module)}
    known = _Effects()
    files = model_files(model, [t.fn for t in targets])
    roots = _roots(model, method, targets)
    for target in chosen:
        fn = target.fn
        owner = target.owner
        hosted = frozenset(k for k, m in owner._modules.items() if id(m) in hosts) \
            if isinstance(owner, torch.nn.Module) else frozenset()
        refs = _referenced(fn, cells)
        done = _rewrite(fn, {name: cells[h] for name, h in refs.items()}, dispatch=True, hosted=hosted,
                        calls=((), ()) if fn is library_root.library_forward else known.calls(fn, _owners(fn, targets)),
                        files=files, root=fn in roots, registered=_registered(fn, targets))
        dispatch.append((target, done.fn))
        record.functions.append(done.record)
    staged = [(t.owner, t.attr, _bind(t, staged_done[t.fn].fn)) for t in staged_targets]
    return DispatchPlan(staged, dispatch, record)


def _library_root(model: torch.nn.Module, method: str) -> disc.Target:
    """The host program of a method whose code is torch's (never rewritten): the whole call as one
    region, so the host passes it tensors rather than running torch's code on its arrays."""
    if method != "forward":
        raise DyclError(f"{type(model).__name__}.{method} is torch's own code, which the dispatch host runs only as forward",
                        fix='convert it with host="staged" (or "auto"), or wrap the call in a forward of your own module')
    return disc.Target(library_root.library_forward, model, method, "method", model)


@exclusive
def run_dispatch_trace(model: torch.nn.Module, method: str, args: Any, hosted: frozenset = frozenset(),
                       alias_choices: Sequence[tuple[str, bool]] = ()) -> tuple[Any, list[tuple[str, bool]]]:
    """Run the dispatch rewrite eagerly in torch (regions as plain Python), recording every host
    decision at a data-dependent site: the decisions the dispatch host must make too. Islands
    named in `hosted` run their host version, as on a dispatch host where they did not stage;
    islands follow `alias_choices` where given, the host's choices (whether each island call ran
    its host version) in call order (`DispatchHost.alias_choices` of its last traced call)."""
    from dycl_jax.rewrite.regions import islands_on_host, recording_decisions, replaying_alias_choices

    args = args if isinstance(args, tuple) else (args,)
    plan = dispatch_plan(model, method)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), patched([DispatchPlan.bind(t, fn) for t, fn in plan.dispatch]), \
                islands_on_host(hosted), replaying_alias_choices(alias_choices), recording_decisions() as decisions:
            out = getattr(model, method)(*args)
    finally:
        model.train(was_training)
    return out, decisions
