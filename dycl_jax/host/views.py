"""Finds the views a part makes of tensors other live names hold, where a later in-place update may reach one of them: tracked by the host, or refused."""
from __future__ import annotations

import sys
from typing import Any, Callable, Sequence


from dycl_jax.capture.ordered_dicts import leaves_in_order
from dycl_jax.capture.view_layout import Layout
from dycl_jax.errors import AliasedUpdateError, Location, limitation
from dycl_jax.host.values import ARRAYS
from dycl_jax.rewrite.frames import visible_locals
from dycl_jax.rewrite.regions import RegionSpec


def user_locals(env: dict, operators: Sequence[Callable]) -> dict:
    """The user's names as the part is called: those the function that called one of
    `operators` (the generated `region` / `island` call) sees (`visible_locals`: an enclosing
    generated function's too), with `env` (the names a split region computed so far) over them."""
    codes = {op.__code__ for op in operators}
    frame = sys._getframe()
    while frame is not None and frame.f_code not in codes:
        frame = frame.f_back
    caller = frame.f_back if frame is not None else None
    return {**(visible_locals(caller) if caller is not None else {}), **env}


def check_views_kept(spec: RegionSpec, part: Any, vals: tuple, leaves: list, outs: tuple,
                     views: tuple[tuple[int, str, int], ...], local: dict, layouts: tuple = (),
                     mutated: tuple[int, ...] = ()) -> tuple[tuple[Tracked, ...], tuple[tuple[int, Tracked | None], ...]]:
    """`views` (capture/region.view_pairs): output leaf k shares memory with input or output leaf
    j. Torch's update of one reaches the other; the host's arrays are separate. Where the view
    and a name still holding the other are both read later and one of them may be updated in
    place after this part (`RegionSpec.updated_later`, a later statement's `updates`), the pair
    is returned for the host to track per call (host/view_families.py) if both are tensors under
    names of their own and `layouts` (capture/view_layout.py) gives the view's layout; else refused.
    Second: (input leaf, pair or None) of the live views that may be updated whose base input no
    live name holds, to be tracked (or refused, None) where that input is of a family at a call."""
    ins = [n for n, v in zip(part.ins, vals) for _ in leaves_in_order(v)]
    out_names = [n for n, v in zip(part.outs, outs) for _ in leaves_in_order(v)]
    out_leaves = leaves_in_order(outs)
    tracked: list[Tracked] = []
    conditional: list[tuple[int, Tracked | None]] = []
    later = None if spec.live_after is None else spec.live_after.union(*(st.ins for st in spec.statements[part.stop:]))
    live = (lambda n: not n.startswith("_dycl_")) if later is None else (lambda n: n in later)
    values = {**dict(zip(part.ins, vals)), **dict(zip(part.outs, outs))}

    rest = spec.statements[part.stop:]
    # (a container is changed without its tensors but by an update of its elements)
    updates = {False: [spec.updated_later, *(st.updates for st in rest)],
               True: [spec.deep_later, *(st.deep_updates for st in rest)]}

    def risky(n: str) -> bool:
        return any(later is None or n in later for later in updates[type(values.get(n)) in (list, tuple, dict)])
    for n, (k, kind, j) in enumerate(views):
        if k >= len(out_names) or (kind == "out" and j >= len(out_names)) or (kind == "in" and j >= len(ins)):
            continue  # a module attribute's value: not a name of the function
        view = out_names[k]
        if kind == "out":  # every output name of that tensor (`a = v` gives two)
            holders = [out_names[i] for i, leaf in enumerate(out_leaves) if leaf is out_leaves[j]]
        else:  # the caller's array of that input leaf, under the names the part does not rebind
            holders = [m for m, value in local.items() if value is leaves[j] and m not in part.outs]
            # and the part's own name of it, where its output is that tensor: passed through (a
            # region passes every name that may hold a tensor its statement updates) or updated
            name = ins[j]
            if name in part.outs and name not in holders \
                    and (j in mutated or values.get(name) is leaves[j]):
                holders.append(name)
        pair = _trackable(part, vals, outs, k, kind, j, layouts[n] if n < len(layouts) else None, mutated)
        for base in holders:
            if base != view and not base.startswith("_dycl_") and live(view) and live(base) \
                    and (risky(view) or risky(base)):
                if pair is not None:
                    tracked.append(pair)
                    break
                st = next((s for s in reversed(spec.statements[part.first:part.stop]) if view in s.outs),
                          spec.statements[part.first])
                raise AliasedUpdateError(
                    f"`{view}` is a view of `{base}` (or `{base}` of it: slicing, `.view`, `.t()`, `.detach()`), "
                    "both are read later and one of them may be updated in place; torch changes both, the "
                    "dispatch host holds them as separate arrays and would change only one",
                    location=Location(spec.file, st.line, st.code),
                    fix=limitation(f"the dispatch host rebuilds a view after an update made in another region only "
                                   f"where `{view}` and `{base}` are each a name's one tensor (not in a list, tuple "
                                   "or dict) with shapes fixed per call", "dycl_jax/host/views.py, check_views_kept",
                                   'host="staged" keeps them one memory where the whole method stages'))
        else:
            if kind == "in" and live(view) and risky(view) and not view.startswith("_dycl_"):
                # no live name holds its base, but another view of that memory may be live
                # (`a = t[0]` earlier, `b = t[:, 0]` here): the host tracks it, or refuses, where
                # the base it took is of a family at the call (`Compiled.conditional`)
                conditional.append((j, pair))
    return tuple(tracked), tuple(conditional)


# (view output leaf, "in" or "out", base leaf, the view's layout in the base's memory)
Tracked = tuple[int, str, int, Layout]


def _trackable(part: Any, vals: tuple, outs: tuple, k: int, kind: str, j: int, layout: Layout | None,
               mutated: tuple[int, ...]) -> Tracked | None:
    """The pair as the host registers it per call, or None: the view and its base must each be a
    name's one tensor (a view inside a list is not rebuilt); a base input the part updates in
    place is its output of the same name (the new array)."""
    if layout is None:
        return None
    out_at = _single_leaves(part.outs, outs)
    if k not in out_at.values():
        return None
    if kind == "in" and j in mutated:
        # the updated tensor is the output of a name that held it and that the part does not
        # rebind (`v = f(v); a.add_(1)` with `a` the old `v`: `a`'s output, not `v`'s)
        ins_at = _single_leaves(part.ins, vals)
        base = next((n for n, leaf in ins_at.items() if leaf == j), None)
        if base is None:
            return None
        array = vals[part.ins.index(base)]
        kept = {part.ins[i] for i, _ in part.unbound}
        holder = next((n for n in ins_at if n in kept and n in out_at and vals[part.ins.index(n)] is array), None)
        if holder is None:
            return None
        return k, "out", out_at[holder], layout
    if kind == "in":
        return (k, kind, j, layout) if j in _single_leaves(part.ins, vals).values() else None
    return (k, kind, j, layout) if j in out_at.values() else None


def _single_leaves(names: Sequence[str], values: tuple) -> dict[str, int]:
    """name -> its leaf position, for the names whose value is one array."""
    at, found = 0, {}
    for n, v in zip(names, values):
        count = len(leaves_in_order(v))
        if isinstance(v, ARRAYS):
            found[n] = at
        at += count
    return found
