"""Which of the dispatch host's arrays are views of which, so that a program updating one in place also gives the others their new values."""
from __future__ import annotations

from typing import Any, Sequence

from dycl_jax.capture.view_layout import Layout
from dycl_jax.errors import AliasedUpdateError, Location, limitation
from dycl_jax.host.values import ARRAYS
from dycl_jax.rewrite.regions import RegionSpec


class Families:
    """Per forward: view array -> (its root array, its layout in the root's memory).

    In torch `w = v[:, 1:]` shares `v`'s memory; on the host they are two arrays. A part that
    takes both is keyed with the relation (`keyed`): its capture makes `w` a view of `v` again
    (capture/region.py), so the program's update of either reaches the other, and its outputs
    hold both new values. The region passes every live name that may hold an updated tensor
    through the update (`dispatch_split._kept_by_update`), so each is among such a part's
    inputs; `check` refuses where one is there without the relation. Entries hold their arrays,
    so an id is never reused while it is a key; each forward has its own."""

    def __init__(self) -> None:
        self._views: dict[int, tuple[Any, Any, Layout | None]] = {}
        self._roots: dict[int, Any] = {}  # id(root) -> root, for roots with views

    def __bool__(self) -> bool:
        return bool(self._views)

    def member(self, array: Any) -> tuple[Any, Layout | None] | None:
        """(root, layout) of a registered view, (root, None) of a root with views, else None."""
        entry = self._views.get(id(array))
        if entry is not None and entry[0] is array:
            return entry[1], entry[2]
        if self._roots.get(id(array)) is array:
            return array, None
        return None

    def register(self, view: Any, base: Any, layout: Layout | None) -> None:
        """`view` (an array) shares `base`'s memory at `layout` (None: a layout the host cannot
        make again, kept so that an update of either is refused)."""
        if view is base:
            return
        found = self.member(base)
        if found is None or found[0] is base:  # base is a root: fresh, it holds its values in order
            root = base
            layout = layout if layout is not None and layout.contiguous else None
        else:  # a view of a view: strides count storage elements, offsets add up
            root, outer = found
            layout = None if outer is None or layout is None else \
                layout._replace(offset=outer.offset + layout.offset, detached=outer.detached or layout.detached)
        if layout is not None and not _inside(layout, int(root.size)):
            layout = None  # (`a = t[0]; b = t[:, 0]`: b reaches past a, so a is no root for it)
        self._views[id(view)] = (view, root, layout)
        self._roots[id(root)] = root

    def keyed(self, key: tuple, leaves: Sequence[Any]) -> tuple:
        """A part's signature key with (view leaf, root leaf, layout) for each input leaf that is
        a view of another input leaf: its program is captured with the one made from the other."""
        first: dict[int, int] = {}
        for i, v in enumerate(leaves):
            if isinstance(v, ARRAYS):
                first.setdefault(id(v), i)
        related = []
        for i, v in enumerate(leaves):
            entry = self._views.get(id(v))
            if entry is not None and entry[0] is v and entry[2] is not None and first.get(id(v)) == i:
                j = first.get(id(entry[1]))
                if j is not None:
                    related.append((i, j, entry[2]))
        if not related:
            return key
        tree, keys, grad, same = key
        return tree, keys, grad, same + tuple(related)

    def check(self, spec: RegionSpec, part: Any, leaves: Sequence[Any], mutated: Sequence[int], same: tuple) -> None:
        """Refuse a program that updated an array of a family while it took another array of
        that family without the relation (its root was not among its inputs, or the layout is
        not one the capture can make). (A staged island given an array of a family runs its host
        version instead: DispatchHost._island.)"""
        related = {p[0] for p in same} | {p[1] for p in same}
        for leaf in mutated:
            found = self.member(leaves[leaf])
            if found is None:
                continue
            root = found[0]
            for i, v in enumerate(leaves):
                other = self.member(v) if v is not leaves[leaf] else None
                if other is not None and other[0] is root and i not in related:
                    _refuse(spec, part.first, "the program that updates one takes the other without the "
                            "tensor it views, or at a layout it cannot make again")

    def refuse_view(self, spec: RegionSpec, first: int) -> None:
        """A part made a view of a family's array that the host cannot track (in a list, tuple or
        dict, or without a layout) while another array of the family is live."""
        _refuse(spec, first, "the view made here cannot be made again from it (it is held in a list, tuple or "
                "dict, or its layout is not fixed)")

    def refuse_updates(self, spec: RegionSpec, first: int, leaves: Sequence[Any], mutated: Sequence[int]) -> None:
        """A part run on the host updates its torch copies: refused where one is of a family."""
        for leaf in mutated:
            if self.member(leaves[leaf]) is not None:
                _refuse(spec, first, "a statement run on the host updates one in place")


def _inside(layout: Layout, n: int) -> bool:
    """Whether every element of the view lies among the root's n elements (strides are >= 0)."""
    if any(size == 0 for size in layout.size):
        return True
    last = layout.offset + sum((size - 1) * stride for size, stride in zip(layout.size, layout.stride))
    return layout.offset >= 0 and last < n


def _refuse(spec: RegionSpec, first: int, why: str) -> None:
    st = spec.statements[first]
    raise AliasedUpdateError(
        f"two tensors here share memory (one is a view of the other: slicing, `.view`, `.t()`), the dispatch "
        f"host holds them as separate arrays, and {why}; torch changes both",
        location=Location(spec.file, st.line, st.code),
        fix=limitation("the dispatch host keeps a view and the tensor it views one memory where a program takes "
                       "both with static shapes, or the view alone", "dycl_jax/host/view_families.py",
                       'host="staged" keeps them one memory where the whole method stages'))
