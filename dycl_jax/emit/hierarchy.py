"""Module calls rebuilt from torch.export's `nn_module_stack`: a graph's nodes as nested calls."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Container, Union

import torch.fx


@dataclass
class Call:
    """One call of the module at `path` (torch.export's stack key `key`): its nodes, nested."""

    key: str
    path: str
    items: list["Item"] = field(default_factory=list)
    nodes: list[torch.fx.Node] = field(default_factory=list)  # every node inside, in order


Item = Union[torch.fx.Node, Call]


def _under(path: str, context: str) -> bool:
    return path != context and (context == "" or path.startswith(context + "."))


def stack(node: torch.fx.Node, known: Container[str]) -> list[tuple[str, str]]:
    """(key, module path) of every module around `node`, outermost first, paths from the model.

    Some exports name the model's modules under the capture wrapper (`m.conv1`): those paths
    lose the wrapper's `m.` where the model has the shorter one and not the longer."""
    out = []
    for key, (path, _cls) in (node.meta.get("nn_module_stack") or {}).items():
        if path == "m" or (path.startswith("m.") and path[2:] in known and path not in known):
            path = path[2:]
        if path and path in known:
            out.append((key, path))
    return out


def _entry(node: torch.fx.Node, context: str, skip: frozenset[str], known: Container[str]) -> tuple[str, str] | None:
    # the outermost module of this node's stack that lies inside `context` and is not inlined
    for key, path in stack(node, known):
        if key not in skip and _under(path, context):
            return key, path
    return None


def build(nodes: list[torch.fx.Node], context: str, inline: Callable[[Call], bool], known: Container[str],
          skip: frozenset[str] = frozenset()) -> list[Item]:
    """The items of a body running in module `context`: plain nodes and module calls.

    A call whose nodes are not contiguous (another statement runs between them) and a call
    `inline` asks for are dissolved into the enclosing body: the same nodes, in the same order."""
    runs: list[tuple[tuple[str, str] | None, list[torch.fx.Node]]] = []
    for node in nodes:
        entry = _entry(node, context, skip, known)
        if runs and runs[-1][0] == entry and entry is not None:
            runs[-1][1].append(node)
        else:
            runs.append((entry, [node]))
    keys = [e[0] for e, _ in runs if e is not None]
    split = {k for k in keys if keys.count(k) > 1}
    if split:
        return build(nodes, context, inline, known, skip | split)
    items: list[Item] = []
    for entry, run in runs:
        if entry is None:
            items.extend(run)
            continue
        call = Call(entry[0], entry[1], nodes=run)
        if inline(call):
            items.extend(build(run, context, inline, known, skip | {entry[0]}))
        else:
            call.items = call.items or build(run, entry[1], inline, known, skip)
            items.append(call)
    return items


def relative(path: str, context: str) -> str:
    """`path` as an attribute chain from `self` of module `context` (`self.layers[0].conv1`)."""
    rest = path if context == "" else path[len(context) + 1:]
    return "self" + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in rest.split("."))
