"""What makes a chunk of a loop (rewrite/chunks.py) differ from the loop it stands for, checked as
the chunk is traced: each refusal is a CaptureError, after which the loop runs as a host loop (or
the statements around it as the host version's regions)."""
from __future__ import annotations

from typing import Any

import torch

from dycl_jax.errors import CaptureError, Location
from dycl_jax.rewrite.sites import Site


def _shares(u: Any, v: Any) -> bool:
    """Whether `u` is `v`, a view of the same tensor, or a list, tuple or dict holding `v`."""
    if u is v:
        return True
    if isinstance(u, torch.Tensor) and isinstance(v, torch.Tensor):
        return u._base is v or v._base is u or u._base is not None and u._base is v._base
    if isinstance(u, (list, tuple)):
        return any(x is v for x in u)
    return isinstance(u, dict) and any(x is v for x in u.values())


def refuse_shared(site: Site, named: dict[str, Any]) -> None:
    """A name the loop updates in place (a list it appends to, a tensor) that another name holds
    too as the loop starts (`saved = history` before it): the chunk's iterations update copies,
    so the other name would miss the updates. Refused: the loop runs as a host loop. (A loop
    alone is refused at the call, `regions.aliased_at_call`; statements before it in the chunk
    can make such names where no call sees them.)"""
    for n in {*site.owned, *site.deep}:
        v = named.get(n)
        if not isinstance(v, (torch.Tensor, list, dict)):
            continue
        for m, u in named.items():
            if m != n and not m.startswith("_dycl_while") and _shares(u, v):
                raise CaptureError(f"the loop updates `{n}` in place and `{m}` holds it too as the loop starts",
                                   location=site.location)


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in a value, in its lists, tuples and dicts too."""
    if isinstance(value, torch.Tensor):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    return [t for x in items for t in _tensors(x)]


def refuse_shared_outputs(where: Location, outs: dict[str, Any], ins: dict[str, Any]) -> None:
    """An output that is a view of a tensor another input or output name holds (`w = v[:, 1:]`
    before the loop, both read after it): the program gives each output its own array, so a later
    update in place through one name would miss the other, where the host's regions keep such
    names together (host/views.py). Refused: the statements run as the host version's regions.
    (One tensor under two names stays one array: the capture gives it one output.)"""
    given = [t for v in ins.values() for t in _tensors(v)]
    named = [(n, t) for n, v in [*ins.items(), *outs.items()] for t in _tensors(v)]
    for n, v in outs.items():
        for t in _tensors(v):
            if t._base is None or any(t is u for u in given):  # (not a view, or an input passed on)
                continue
            other = next((m for m, u in named if m != n and u is not t and _shares(t, u)), None)
            if other is not None:
                raise CaptureError(f"`{n}` is a view of a tensor `{other}` holds too after the loop, which the "
                                   "chunk's outputs would part", location=where)


def versions(named: dict[str, Any]) -> list[tuple[str, torch.Tensor, int]]:
    """(name, tensor, version counter) of the tensors the names hold as the loop starts (those in
    their lists, tuples and dicts too)."""
    return [(n, t, t._version) for n, v in named.items() for t in _tensors(v)]


def refuse_updated(site: Site, versions: list[tuple[str, torch.Tensor, int]]) -> None:
    """A tensor the loop started with that its iterations updated in place (an invariant,
    `flat[i].add_(1)`, or a view of one): the chunk's iterations past the stop would have
    updated it too. Refused: the loop runs as a host loop. (A carried name the body updates is
    its own copy per iteration, `own`.)"""
    for n, t, version in versions:
        if t._version != version:
            raise CaptureError(f"the loop updates `{n}` in place, which its iterations past the stop "
                               "would update too", location=site.location)
