"""The dispatch host's watch on module attributes (host/attributes.py): every kind of write a
host statement can make is seen, restored, and nothing else is reported."""
from __future__ import annotations

import torch
from torch import nn

from dycl_jax.host.attributes import DynamicAttributes


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.saved: list = []
        self.table: dict = {"a": 1}
        self.stride = (1, 1)
        self.hidden = None


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Inner()
        self.count = 0


def _writes(attrs: DynamicAttributes, write) -> set[str]:
    before = attrs.snapshot()
    write()
    changed = {k for _, k, _ in attrs.changed(before)}
    attrs.restore(before)
    return changed


def test_every_kind_of_write_is_seen_and_undone() -> None:
    m = _Outer()
    attrs = DynamicAttributes(m)
    saved, table = m.inner.saved, m.inner.table
    cases = {
        "rebind": (lambda: setattr(m.inner, "hidden", torch.ones(1)), {"hidden"}),
        "append": (lambda: m.inner.saved.append(torch.ones(1)), {"saved"}),
        "dict item": (lambda: m.inner.table.update(b=2), {"table"}),
        "dict item replaced": (lambda: m.inner.table.__setitem__("a", 5), {"table"}),
        "new attribute": (lambda: setattr(m, "fresh", 3), {"fresh"}),
        "python int": (lambda: setattr(m, "count", 1), {"count"}),
        # export re-creates config tuples: an equal plain value is not a write
        "equal tuple": (lambda: setattr(m.inner, "stride", (1, 1)), set()),
        "private": (lambda: setattr(m.inner, "_cache", 1), set()),
        "nothing": (lambda: None, set()),
    }
    for label, (write, expected) in cases.items():
        for _ in range(2):  # the second snapshot reuses what the first learnt about each dict
            assert _writes(attrs, write) == expected, label
            assert m.inner.saved is saved and saved == [], label
            assert m.inner.table is table and table == {"a": 1}, label
            assert m.inner.hidden is None and m.count == 0 and not hasattr(m, "fresh"), label


def test_a_replaced_list_is_watched_afresh() -> None:
    m = _Outer()
    attrs = DynamicAttributes(m)
    attrs.snapshot()
    m.inner.saved = [1]  # a new list object: its contents are what the next snapshot copies
    assert _writes(attrs, lambda: m.inner.saved.append(2)) == {"saved"}
    assert m.inner.saved == [1]
