"""Padded method outputs for unrolled decode loops (`to_jax(..., max_len=N)`, or `host="auto"`
where a method's values differ in shape between its paths).

An unrolled loop (converters/decode_loops.py) exits through a `return` in the iteration it
stops in, so every value it computes has that iteration's exact shape. Only the method's return
value (`_dycl_retval`) meets values of other iterations, at the joins of the exit conds: there,
and only there, a tensor whose shape differs between the paths becomes `Padded` (zeros up to
the largest shape, with its true shape as `lengths`). Nothing reads the return value before
the method returns, so no user code ever computes on padding. `Decoded` wraps the method's
result with the flag saying the loop ran out of `max_len` iterations without exiting.

Decisions: the program computes both paths of every exit and the iterations after the one the
loop stopped in. Each runs under a *reach* (modes.reach: whether it runs in the original
program); an exit's decision is recorded through `dycl::decided` only where it is reached, so
the padded program's decision trace is the exact one (`mark`).
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree

from dycl_jax.errors import DyclError, Location
from dycl_jax.rewrite import modes, plan as plans
from dycl_jax.rewrite.plan import Undefined
from dycl_jax.rewrite.sites import RETFLAG, RETVAL, Site

_NUMBER = (bool, int, float)


class Padded:
    """A tensor padded with zeros to a fixed shape; `lengths` is its true shape (int vector)."""

    __slots__ = ("value", "lengths")

    def __init__(self, value: Any, lengths: Any) -> None:
        self.value = value
        self.lengths = lengths

    def __repr__(self) -> str:
        return f"Padded(value={self.value!r}, lengths={self.lengths!r})"


class Decoded:
    """The result of a method with an unrolled loop: `value` (with `Padded` leaves where shapes
    vary) and `exceeded` (true when the loop at `where` needed more than `max_len` iterations)."""

    __slots__ = ("value", "exceeded", "where")

    def __init__(self, value: Any, exceeded: Any, where: tuple) -> None:
        self.value = value
        self.exceeded = exceeded
        self.where = where  # (file, line, code, max_len) of the unrolled loop

    def __repr__(self) -> str:
        return f"Decoded(value={self.value!r}, exceeded={self.exceeded!r})"


pytree.register_pytree_node(Padded, lambda p: ([p.value, p.lengths], None), lambda c, _: Padded(*c))
pytree.register_pytree_node(Decoded, lambda d: ([d.value, d.exceeded], d.where),
                            lambda c, where: Decoded(c[0], c[1], where))


def decoded(value: Any, exceeded: bool, max_len: int, file: str, line: int, code: str) -> Decoded:
    """What a `return` of a method with an unrolled loop returns (generated code calls this)."""
    return Decoded(value, exceeded, (file, line, code, max_len))


class Unroll:
    """The iterations of an unrolled loop: the items of `items` (a `for`) or a count (a `while`),
    at most `max_len` of them; `cut` says the bound stopped it before the loop's own end.

    natural: the bound is auto's, not the user's: a program where the bound stops the loop
    (read as `cut`, on a path that may run) is refused, at `where` (file, line, code)."""

    def __init__(self, items: Iterable | None, max_len: int, natural: bool = False, where: tuple = ()) -> None:
        self.items = items
        self.max_len = max_len
        self.natural = natural
        self.where = where
        self._cut = False

    @property
    def cut(self) -> bool:
        if self._cut and self.natural:
            file, line, code = self.where
            raise DyclError(
                f"the loop at {file.rsplit('/', 1)[-1]}:{line} may need more than {self.max_len} iterations "
                "(no Python bound ends it within them), so it cannot be staged as one padded program",
                location=Location(file, line, code),
                fix='convert with host="dispatch" (exact for every input), or with max_len=N for one staged '
                "program that refuses inputs needing more than N iterations")
        return self._cut

    def __iter__(self) -> Iterator[Any]:
        it = itertools.count() if self.items is None else iter(self.items)
        for _ in range(self.max_len):
            try:
                item = next(it)
            except StopIteration:
                return
            yield item
        if self.items is None:
            self._cut = True
            return
        try:
            next(it)
        except StopIteration:
            return
        self._cut = True


def unrolled(items: Iterable | None, max_len: int, natural: bool = False, file: str = "", line: int = 0,
             code: str = "") -> Unroll:
    return Unroll(items, max_len, natural, (file, line, code))


def exact(out: Any) -> Any:
    """A padded method result (torch tensors) as the exact one: `Padded` leaves cut to their lengths."""
    if not isinstance(out, Decoded):
        return out
    leaves, spec = pytree.tree_flatten(out.value, is_leaf=lambda v: isinstance(v, Padded))
    cut = [x.value[tuple(slice(0, int(n)) for n in x.lengths.tolist())] if isinstance(x, Padded) else x
           for x in leaves]
    return pytree.tree_unflatten(cut, spec)


# ---------------------------------------------------------------- the joins of an unrolled method

def prepare(site: Site, fns: Sequence[Callable], exit_only: bool) -> list[Callable]:
    """Paths of a join in the method: where the return flag is a Python True (the method has
    returned), only the return value and the exit flags are read later, so the user's variables
    are left undefined there (placeholders), and a Python counter stays a Python value. The
    false path of an exit-only test on the return flag alone (a guard) runs only when it is set."""
    if RETFLAG not in site.names:
        return list(fns)
    r = site.names.index(RETFLAG)
    dead = [j for j, n in enumerate(site.names) if not n.startswith("_dycl_")]
    guard_false = exit_only and site.exit_flags == (RETFLAG,)

    def wrap(fn: Callable, path: int) -> Callable:
        def run(*args: Any) -> tuple:
            out = list(fn(*args))
            if guard_false and path == 1:
                out[r] = True
            if out[r] is True:
                for j in dead:
                    out[j] = Undefined(site.names[j])
            return tuple(out)
        return run

    return [wrap(fn, k) for k, fn in enumerate(fns)]


def _flatten(value: Any) -> tuple[list[Any], pytree.TreeSpec]:
    return pytree.tree_flatten(value, is_leaf=lambda v: v is None or isinstance(v, (Undefined, Padded)))


def _shape(x: Any) -> tuple:
    return tuple((x.value if isinstance(x, Padded) else x).shape)


def _target(items: list[Any]) -> tuple | None:
    """The common padded shape of one leaf on every path, or None where no padding applies."""
    if not all(isinstance(x, (torch.Tensor, Padded)) for x in items):
        return None
    values = [x.value if isinstance(x, Padded) else x for x in items]
    shapes = [tuple(v.shape) for v in values]
    if not any(isinstance(x, Padded) for x in items) and all(plans.same_shape(s, shapes[0]) for s in shapes):
        return None
    if len({v.dtype for v in values}) > 1 or len({len(s) for s in shapes}) > 1:
        return None  # the plan names the mismatch
    target = []
    for dims in zip(*shapes):
        if all(isinstance(d, int) for d in dims):
            target.append(max(dims))
        elif all(plans.same_shape((d,), (dims[0],)) for d in dims):
            target.append(dims[0])
        else:
            return None
    return tuple(target)


def unify(site: Site, outputs: list[tuple], placeholders: str) -> tuple[plans.Plan, tuple | None]:
    """The output plan of a join in the method, with the return value's leaves that differ in
    shape padded (see `apply`); the second result says how, None when nothing is padded."""
    if RETFLAG in site.names and any(out[site.names.index(RETFLAG)] is True for out in outputs):
        placeholders = "all"  # variables left undefined by `prepare` take placeholders
    if RETVAL not in site.names:
        return plans.build(site, outputs, placeholders), None
    j = site.names.index(RETVAL)
    vals = [out[j] for out in outputs]
    defined = [v for v in vals if not isinstance(v, Undefined)]
    flats = [_flatten(v) for v in defined]
    if len(flats) < 2 or any(f[1] != flats[0][1] for f in flats[1:]):
        return plans.build(site, outputs, placeholders), None
    targets = [_target([f[0][i] for f in flats]) for i in range(len(flats[0][0]))]
    if all(t is None for t in targets):
        return plans.build(site, outputs, placeholders), None
    rest = plans.build(site, [(*out[:j], Undefined(RETVAL), *out[j + 1:]) for out in outputs], placeholders)
    leaves: list[plans.Leaf] = []
    example = []
    for i, t in enumerate(targets):
        items = [f[0][i] for f in flats]
        if t is None:
            leaves.append(plans._unify_leaf(site, j, list(range(len(items))), items, True))
            example.append(0)
            continue
        v = items[0].value if isinstance(items[0], Padded) else items[0]
        leaves += [plans.Leaf(False, dtype=v.dtype, shape=t, device=v.device),
                   plans.Leaf(False, dtype=torch.int64, shape=(len(t),), device=v.device)]
        example.append(Padded(0, 0))
    spec = plans.flatten(pytree.tree_unflatten(example, flats[0][1]))[1]
    rest.vars[j] = plans.VarPlan(spec, leaves)
    return plans.Plan(rest.vars), (j, targets)


def apply(pads: tuple | None, out: tuple) -> tuple:
    """One path's outputs with the return value padded as `unify` planned."""
    if pads is None:
        return out
    j, targets = pads
    if isinstance(out[j], Undefined):
        return out
    leaves, spec = _flatten(out[j])
    new = []
    for x, t in zip(leaves, targets):
        if t is None:
            new.append(x)
        elif isinstance(x, Padded):
            new.append(Padded(_pad(x.value, t), x.lengths))
        else:
            new.append(Padded(_pad(x, t), _lengths(x)))
    return (*out[:j], pytree.tree_unflatten(new, spec), *out[j + 1:])


def _pad(x: torch.Tensor, target: tuple) -> torch.Tensor:
    extra = [t - d if isinstance(t, int) and isinstance(d, int) else 0 for t, d in zip(target, x.shape)]
    if not any(extra):
        return x
    widths: list[int] = []
    for e in reversed(extra):  # F.pad lists (before, after) from the last dimension
        widths += [0, e]
    return F.pad(x, widths, value=False if x.dtype == torch.bool else 0)


def _lengths(x: torch.Tensor) -> torch.Tensor:
    # one `full` per dimension, not torch.tensor(shape): a branch graph may hold no tensor
    # constant (see staged._inline_scalar_constants), and a dimension may be symbolic
    return torch.stack([torch.full((), d, dtype=torch.int64) for d in x.shape])


def selects(site: Site) -> bool:
    """A join in an unrolled method that may run as a select (see `select`): a guard on the
    return flag alone, or an `if` that may return (an exit of the loop)."""
    return site.pad and ((site.kind == "guard" and site.exit_flags == (RETFLAG,))
                         or (site.kind == "if" and RETFLAG in site.names))


class NoSelect(Exception):
    """The paths of a join leave a user's variable with values a select cannot merge; `pred` is
    the join's predicate as `mark` left it (a cond takes it instead)."""

    def __init__(self, what: str, pred: Any = None) -> None:
        super().__init__(what)
        self.pred = pred


def in_unrolled(site: Site, what: str) -> DyclError:
    """The refusal of a construct a padded program cannot stage with its exact decisions."""
    return DyclError(
        f"{site.construct}: {what} inside a loop unrolled into one padded program cannot record which of its "
        "decisions the original program makes", location=site.location,
        fix='convert with host="dispatch" (host="auto" does so itself)')


def _and(r: Any, p: torch.Tensor) -> torch.Tensor:
    return p if r is None else torch.logical_and(r, p)


def mark(site: Site, pred: torch.Tensor, running: Any = None, exit_only: bool = False) -> torch.Tensor:
    """The decision at `site` recorded where it is reached (the reach, and `running`: no exit flag
    set before it); the predicate to use instead of `pred` (staging: the `dycl::decided` node)."""
    mode, r = modes.current(), modes.reach()
    if mode not in ("staging", "tracing"):
        return pred
    if r is modes.INSIDE_COND:
        if mode == "staging":
            raise in_unrolled(site, "a branch")
        r = None
    if running is not None:
        r = _and(r, running)
    if exit_only or site.kind == "guard":
        return pred  # no decision of the user's here: an exit flag's test
    if mode == "tracing":
        if r is None or bool(r):
            modes.record(site, bool(pred))
        return pred
    return modes.decided(pred, torch.ones((), dtype=torch.bool) if r is None else r, site.label)


def select(site: Site, pred: torch.Tensor, true_fn: Callable, false_fn: Callable, inputs: tuple,
           exit_only: bool, running: Any = None) -> tuple:
    """An exit of an unrolled loop, or a guard on the return flag, computed on both paths and
    then selected by `pred`, rather than as a cond.

    On a path that has returned only the return value counts (`prepare` leaves the rest
    undefined), so the other path's values are taken as they are, and only the return value
    and its flag are chosen by `pred`. With no cond around an iteration's body, torch.export
    traces it once rather than several times over (once per graph branch and pass), which
    keeps conversion time linear and small in `max_len`; the program then computes every
    iteration up to the bound. Raises NoSelect where a variable both paths keep differs.
    Each path runs under its reach (the join's, and `pred` or not `pred`), the decision
    recorded by `mark`.
    """
    marked = mark(site, pred, running, exit_only)
    r = modes.reach()
    r = None if r is modes.INSIDE_COND else r
    if running is not None:
        r = _and(r, running)
    paths = prepare(site, [true_fn, false_fn], exit_only)
    with modes.reached(_and(r, pred)):
        t = tuple(paths[0](*inputs))
    with modes.reached(_and(r, torch.logical_not(pred))):
        f = tuple(paths[1](*inputs))
    try:
        return _selected(site, marked, t, f)
    except NoSelect as exc:
        raise NoSelect(str(exc), marked) from None


def _selected(site: Site, pred: torch.Tensor, t: tuple, f: tuple) -> tuple:
    out: list[Any] = []
    for j, n in enumerate(site.names):
        a, b = t[j], f[j]
        if isinstance(b, Undefined) or plans.same_python(a, b):
            out.append(a)
        elif isinstance(a, Undefined):
            out.append(b)
        elif n == RETVAL:
            _, pads = unify(site, [t, f], "all")
            a, b = apply(pads, t)[j], apply(pads, f)[j]
            la, spec = pytree.tree_flatten(a)
            lb, spec_b = pytree.tree_flatten(b)
            if spec != spec_b:
                raise NoSelect(n)
            out.append(pytree.tree_unflatten([_where(pred, x, y) for x, y in zip(la, lb)], spec))
        else:
            out.append(_where(pred, a, b))
    return tuple(out)


def _tensor(v: Any) -> torch.Tensor:
    return v if isinstance(v, torch.Tensor) else torch.tensor(v)


def _where(pred: torch.Tensor, a: Any, b: Any) -> Any:
    if plans.same_python(a, b):
        return a
    if isinstance(a, Padded) or isinstance(b, Padded) or not all(isinstance(v, (torch.Tensor, *_NUMBER)) for v in (a, b)):
        raise NoSelect("structure")
    a, b = _tensor(a), _tensor(b)
    if a.dtype != b.dtype or not plans.same_shape(tuple(a.shape), tuple(b.shape)):
        raise NoSelect("shape")
    return torch.where(pred, a, b)

