"""A structural fingerprint of an fx graph: equal for graphs that differ only in which
parameters they read, so identical sub-networks can share one compiled executable."""
from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.fx


def _meta(node: torch.fx.Node) -> Any:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return (tuple(int(d) if isinstance(d, int) else str(d) for d in val.shape), str(val.dtype))
    if isinstance(val, (list, tuple)):
        return tuple(_meta_value(v) for v in val)
    return _meta_value(val)


def layout_meta(node: torch.fx.Node) -> Any:
    """`_meta` plus strides and, for the input of a strided view, its storage offset: what
    lowerings read of torch's layout (`as_strided` in lower/ops/layout.py)."""
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    strides = tuple(tuple(str(s) for s in v.stride()) if isinstance(v, torch.Tensor) else None for v in vals)
    src = node.args[0] if node.target in _STRIDED and node.args else None
    offset = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
    return _meta(node), strides, (str(offset.storage_offset()), offset.is_contiguous()) if isinstance(
        offset, torch.Tensor) else None


_STRIDED = (torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_copy.default)


def _meta_value(val: Any) -> Any:
    if isinstance(val, torch.Tensor):
        return (tuple(str(d) for d in val.shape), str(val.dtype))
    return type(val).__name__


def _describe(gm: torch.fx.GraphModule, out: list[str], state_inputs: int = 0, layout: bool = False) -> None:
    meta = layout_meta if layout else _meta
    index: dict[torch.fx.Node, int] = {}

    def arg(a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            return f"%{index[a]}"
        if isinstance(a, (list, tuple)):
            return type(a)(arg(x) for x in a)
        if isinstance(a, dict):
            return {k: arg(v) for k, v in a.items()}
        return repr(a)

    for k, node in enumerate(gm.graph.nodes):
        if node.op == "placeholder" and k < state_inputs and not node.users:
            continue  # export lifts every parameter of the module; only the ones read count
        index[node] = len(index)
        if node.op == "get_attr":
            sub = getattr(gm, str(node.target), None)
            if isinstance(sub, torch.fx.GraphModule):
                out.append(f"sub{index[node]}{{")
                _describe(sub, out, layout=layout)
                out.append("}")
                continue
            out.append(f"{index[node]} get_attr {meta(node)}")
            continue
        target = node.target if node.op != "placeholder" else ""  # placeholder names carry parameter paths
        out.append(f"{index[node]} {node.op} {target} {arg(node.args)} {arg(node.kwargs)} {meta(node)}")


def graph_fingerprint(gm: torch.fx.GraphModule, state_inputs: int = 0, layout: bool = False) -> str:
    """Equal for graphs with the same ops, shapes and inputs; of the first `state_inputs`
    placeholders (the lifted parameters) only those the graph reads count. With `layout`,
    every value's strides and storage offset count too."""
    lines: list[str] = []
    _describe(gm, lines, state_inputs, layout)
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()
