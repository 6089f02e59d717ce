"""Output plans: how the values of several paths (branches, loop iterations) become one
fixed list of tensors, with Python constants kept aside; located errors where they cannot."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
import torch.utils._pytree as pytree

from dycl_jax.errors import PathMismatchError
from dycl_jax.rewrite.constants import ConstTensor, opaque, same_constant
from dycl_jax.rewrite.sites import RETVAL, Site

_NUMBER = (bool, int, float)


class Undefined:
    """The value of a variable not assigned yet (a generated function still passes it along)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<undefined {self.name}>"

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise UnboundLocalError(f"local variable {self.name!r} referenced before assignment")

    def __getattr__(self, attr: str) -> Any:  # `x.sum()` on an unassigned x fails as Python would
        if attr.startswith("__"):
            raise AttributeError(attr)  # protocol probes (copy, pickle) must see a plain object
        return self._fail()

    __bool__ = __call__ = __iter__ = __len__ = __getitem__ = _fail
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __matmul__ = _fail
    __lt__ = __le__ = __gt__ = __ge__ = __neg__ = __index__ = __float__ = __int__ = _fail


def _leaf(v: Any) -> bool:
    return v is None or isinstance(v, Undefined)


def flatten(value: Any) -> tuple[list[Any], pytree.TreeSpec]:
    return pytree.tree_flatten(value, is_leaf=_leaf)


def same_python(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if type(a) is not type(b) or not isinstance(a, (*_NUMBER, str, bytes, type(None))):
        return False
    return a == b


def describe(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        dims = ", ".join(str(d) for d in v.shape)
        return f"a {str(v.dtype).replace('torch.', '')}[{dims}] tensor"
    if v is None:
        return "None"
    if isinstance(v, _NUMBER):
        return f"the Python {type(v).__name__} {v!r}"
    return f"a {type(v).__name__}"


def same_shape(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(_same_size(x, y) for x, y in zip(a, b))


def _same_size(x: Any, y: Any) -> bool:
    """Sizes provably equal. Two paths' data-dependent sizes (each path's own `nonzero`) are
    symbols of separate traces: comparing them would record a node in a graph that does not
    know them (torch: "u0 is not tracked with proxy"), so such sizes are equal only as one symbol."""
    if isinstance(x, int) and isinstance(y, int):
        return x == y
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols, statically_known_true

    if free_unbacked_symbols(x) or free_unbacked_symbols(y):
        ex, ey = (v.node.expr if isinstance(v, torch.SymInt) else v for v in (x, y))
        return bool(ex == ey)
    return statically_known_true(x == y)


@dataclass
class Leaf:
    """One leaf of an output: a constant shared by all paths (a Python value or a ConstTensor),
    or a tensor with fixed metadata."""

    const: bool
    value: Any = None
    dtype: torch.dtype | None = None
    shape: tuple = ()
    device: torch.device | None = None


@dataclass
class VarPlan:
    spec: pytree.TreeSpec | None  # None: undefined on every path
    leaves: list[Leaf] = field(default_factory=list)
    undefined: Any = None


class Plan:
    """Per output variable: structure and leaves; tensors travel through the graph op."""

    def __init__(self, vars_: list[VarPlan], same: dict[int, int] | None = None) -> None:
        self.vars = vars_
        self.n_tensors = sum(1 for v in vars_ for leaf in v.leaves if not leaf.const)
        # tensor k -> an earlier tensor that is the same object on every path (aliases: `a = v`
        # passed on, or updated in place through either): after the join they are one tensor again
        self.same = same or {}

    def _travelling(self, values: tuple[Any, ...]) -> Iterator[tuple[Leaf, Any]]:
        # (leaf, value) of every tensor leaf that travels through the graph op, in order
        for var, value in zip(self.vars, values):
            if var.spec is None:
                continue
            leaves = [None] * len(var.leaves) if isinstance(value, Undefined) else flatten(value)[0]
            yield from ((leaf, v) for leaf, v in zip(var.leaves, leaves) if not leaf.const)

    def flatten(self, values: tuple[Any, ...], clone: bool = True) -> list[torch.Tensor]:
        """One path's outputs as the plan's tensors (converted, placeholders, fresh copies)."""
        out: list[torch.Tensor] = []
        for leaf, v in self._travelling(values):
            if isinstance(v, torch.Tensor):
                # a graph op may not return its input or a view of it
                out.append(v.clone() if clone else v)
            elif isinstance(v, _NUMBER):
                out.append(torch.full(leaf.shape, v, dtype=leaf.dtype, device=leaf.device))
            else:  # placeholder for a path that never assigned the variable
                out.append(torch.zeros(leaf.shape, dtype=leaf.dtype, device=leaf.device))
        return out

    def flatten_key(self, values: tuple[Any, ...], tensors: list[Any]) -> tuple:
        """What `flatten(values)` computes, as data: each tensor by its position in `tensors`
        (by identity), each number by type and value, with the leaf metadata it is made in."""
        where = {id(t): k for k, t in enumerate(tensors)}
        out = []
        for leaf, v in self._travelling(values):
            meta = (tuple(str(d) for d in leaf.shape), str(leaf.dtype), str(leaf.device))
            if isinstance(v, torch.Tensor):
                out.append(("tensor", where.get(id(v), -1)))
            elif isinstance(v, _NUMBER):
                out.append(("full", type(v).__name__, repr(v), meta))
            else:
                out.append(("zeros", meta))
        return tuple(out)

    def rebuild(self, tensors: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> tuple[Any, ...]:
        it = iter(range(len(tensors)))
        values = []
        for var in self.vars:
            if var.spec is None:
                values.append(var.undefined)
                continue
            leaves = [(leaf.value.make() if isinstance(leaf.value, ConstTensor) else leaf.value) if leaf.const
                      else tensors[self.same.get(k, k)] for leaf, k in ((leaf, -1 if leaf.const else next(it))
                                                                       for leaf in var.leaves)]
            values.append(pytree.tree_unflatten(leaves, var.spec))
        return tuple(values)

    def one_tensor(self, i: int, j: int) -> bool:
        """Whether output variables i and j are one tensor after the join (`same`)."""
        k = [0]
        pos: dict[int, int] = {}
        for v, var in enumerate(self.vars):
            tensors = [leaf for leaf in var.leaves if not leaf.const] if var.spec is not None else []
            if len(tensors) == 1 and var.spec.is_leaf():
                pos[v] = k[0]
            k[0] += len(tensors)
        if i not in pos or j not in pos:
            return False
        return self.same.get(pos[i], pos[i]) == self.same.get(pos[j], pos[j])

    def tensor_names(self, site: Site) -> list[str]:
        """The variable each tensor travelling through the graph op belongs to (`xs[1]` for a
        leaf of a list or tuple), in the op's output order: how the report names them."""
        out: list[str] = []
        for name, var in zip(site.names, self.vars):
            tensors = [k for k, leaf in enumerate(var.leaves) if not leaf.const]
            whole = var.spec is not None and var.spec.is_leaf()
            out.extend(name if whole else f"{name}[{k}]" for k in tensors)
        return out

    def kinds(self) -> list[tuple]:
        """Per leaf: tensor dtype and rank, or a Python value (compare with `kinds(values)`)."""
        out: list[tuple] = []
        for var in self.vars:
            if var.spec is None:
                out.append(("undef",))
            else:
                out.extend(("py",) if leaf.const else ("t", leaf.dtype, len(leaf.shape)) for leaf in var.leaves)
        return out

    def normalize(self, values: tuple[Any, ...]) -> tuple[Any, ...]:
        """What the graph op would return if this path ran (eager mirror of staging): its tensors
        are the op's outputs, so none of them is a constant whatever this path computed."""
        return self.rebuild([opaque(t) for t in self.flatten(values, clone=False)])


def kinds(values: tuple[Any, ...]) -> list[tuple]:
    out: list[tuple] = []
    for v in values:
        if isinstance(v, Undefined):
            out.append(("undef",))
        else:
            out.extend(("t", x.dtype, x.dim()) if isinstance(x, torch.Tensor) else ("py",) for x in flatten(v)[0])
    return out


def _error(site: Site, msg: str, fix: str) -> PathMismatchError:
    return PathMismatchError(f"{site.construct}: {msg}", location=site.location, fix=fix)


def _data_sized(leaf: Leaf) -> bool:
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return not leaf.const and any(free_unbacked_symbols(d) for d in leaf.shape if isinstance(d, torch.SymInt))


def _unify_leaf(site: Site, j: int, paths: list[int], vals: list[Any], constants: bool) -> Leaf:
    tensors = [(p, v) for p, v in zip(paths, vals) if isinstance(v, torch.Tensor)]
    what = site.what(j)
    if not tensors:
        if all(same_python(vals[0], v) for v in vals[1:]):
            return Leaf(True, vals[0])
        if all(isinstance(v, _NUMBER) for v in vals):
            if all(isinstance(v, bool) for v in vals):
                dtype = torch.bool
            elif any(isinstance(v, float) for v in vals):
                dtype = torch.get_default_dtype()
            else:
                dtype = torch.int64
            return Leaf(False, dtype=dtype, shape=(), device=torch.device("cpu"))
        (pa, a), (pb, b) = next(((paths[0], vals[0]), (p, v)) for p, v in zip(paths, vals) if not same_python(vals[0], v))
        raise _error(site, f"{what} is {describe(a)} on the {site.where(pa, j)} but {describe(b)} on the {site.where(pb, j)}; "
                     "different Python objects cannot be chosen by a tensor condition",
                     f"give {what.split(' ', 1)[-1]} the same value on every path, or compute it as a tensor")
    p0, t0 = tensors[0]
    common = same_constant(vals) if constants else None
    if common is not None:  # the same constant-built tensor on every path: no graph output needed
        return Leaf(True, common, dtype=t0.dtype, shape=tuple(t0.shape), device=t0.device)
    for p, v in zip(paths, vals):
        if isinstance(v, torch.Tensor):
            if v.dtype != t0.dtype or not same_shape(tuple(v.shape), tuple(t0.shape)):
                raise _error(site, f"{what} is {describe(t0)} on the {site.where(p0, j)} but {describe(v)} on the {site.where(p, j)}",
                             "make every path produce the same shape and dtype (pad, slice or cast), "
                             "or convert with the dispatch host")
            continue
        ok = isinstance(v, _NUMBER) and (
            t0.dtype == torch.bool if isinstance(v, bool) else
            t0.dtype.is_floating_point if isinstance(v, float) else
            t0.dtype != torch.bool and not t0.dtype.is_complex)
        if not ok:
            if v is None and site.names[j] == RETVAL:
                fix = "return tensors on every path (e.g. torch.zeros(...) instead of None or falling off the end)"
            elif v is None:
                fix = f"initialise {what.split(' ', 1)[-1]} with a tensor (e.g. torch.zeros(...)) instead of None"
            else:
                fix = "make the value on every path a tensor of the same dtype"
            raise _error(site, f"{what} is {describe(v)} on the {site.where(p, j)} but {describe(t0)} on the {site.where(p0, j)}", fix)
    return Leaf(False, dtype=t0.dtype, shape=tuple(t0.shape), device=t0.device)


def build(site: Site, outputs: list[tuple[Any, ...]], placeholders: str = "retval", constants: bool = True,
          merge: bool = True) -> Plan:
    """Unify the outputs of every path. placeholders: "retval" | "all" — which variables may be
    undefined on some paths (they get zeros of the defining path's structure there). constants:
    whether a constant-built tensor equal on every path stays a constant (not for loop carries:
    the body reads every carried tensor as a graph input). merge: whether outputs that are one
    tensor on every path stay one tensor (`Plan.same`; not for loops, whose body takes each
    carried tensor as its own graph input)."""
    vars_ = []
    objects: list[tuple[int, ...] | None] = []  # per tensor of the plan: its object on each path
    for j in range(len(site.names)):
        vals = [out[j] for out in outputs]
        defined = [p for p, v in enumerate(vals) if not isinstance(v, Undefined)]
        if not defined:
            vars_.append(VarPlan(None, undefined=vals[0]))
            continue
        if len(defined) < len(vals) and not (placeholders == "all" or site.names[j] == RETVAL):
            missing = next(p for p in range(len(vals)) if p not in defined)
            name = site.names[j]
            raise _error(site, f"{site.what(j)} is assigned on the {site.where(defined[0], j)} but not on the "
                         f"{site.path(missing)}, and it is used afterwards",
                         f"assign {name!r} before the {site.kind if site.kind != 'elif' else 'if'} "
                         f"(e.g. {name} = torch.zeros(...)) or on every path")
        flats = {p: flatten(vals[p]) for p in defined}
        spec = flats[defined[0]][1]
        for p in defined[1:]:
            if flats[p][1] != spec:
                raise _error(site, f"{site.what(j)} is {_desc_tree(vals[defined[0]])} on the {site.where(defined[0], j)} "
                             f"but {_desc_tree(vals[p])} on the {site.where(p, j)}",
                             "return the same structure (same tuple/list/dict layout, tensors in the same places) "
                             "on every path")
        leaves = [_unify_leaf(site, j, defined, [flats[p][0][i] for p in defined], constants)
                  for i in range(len(flats[defined[0]][0]))]
        if len(defined) < len(vals) and any(_data_sized(leaf) for leaf in leaves):
            # the placeholder of a path that never assigned it would need the other path's size
            raise _error(site, f"{site.what(j)} is assigned on the {site.where(defined[0], j)} only, with a size "
                         f"that tensor values decide there (`nonzero`, a boolean mask, `.item()`), which the "
                         f"{site.path(next(p for p in range(len(vals)) if p not in defined))} has no value of",
                         "convert with the dispatch host (host=\"auto\" picks it), which runs the construct in Python")
        vars_.append(VarPlan(spec, leaves))
        for i, leaf in enumerate(leaves):
            if not leaf.const:  # per path: the tensor's id, or None where the variable is undefined
                objs = [flats[p][0][i] if p in flats else None for p in range(len(vals))]
                tensors = all(o is None or isinstance(o, torch.Tensor) for o in objs)
                objects.append(tuple(None if o is None else id(o) for o in objs) if tensors else None)
    return Plan(vars_, _same(objects) if merge else None)


def _same(objects: list[tuple[int | None, ...] | None]) -> dict[int, int]:
    """Tensor k -> an earlier tensor j that is the same object as k on every path, or undefined
    together with k (neither is read after such a path: both dead on an exit, say)."""
    same: dict[int, int] = {}
    for k, key in enumerate(objects):
        for j in range(k):
            other = objects[j]
            if key is None or other is None or j in same or all(a is None for a in key):
                continue
            if key == other:
                same[k] = j
                break
    return same


def _desc_tree(v: Any) -> str:
    leaves, spec = flatten(v)
    if spec.is_leaf():
        return describe(v)
    return f"{type(v).__name__} of {len(leaves)} leaves"
