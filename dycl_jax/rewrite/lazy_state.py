"""Model state as graph inputs of a traced branch only where the branch reads it.

A branch made every state tensor of the model an input placeholder of its graph (lifting.py),
and torch builds each placeholder with metadata and a stack trace: for a ResNet-110 with 54
gated blocks, 760 placeholders per branch, 95% of all nodes torch.export traced. Instead the
branch is traced with *probes* in the state slots: fresh tensors of the same metadata that the
tracer does not track, so a read of one is recorded as a tensor constant. Each such constant
then becomes a placeholder (`lift`), the inputs being the state tensors the branch reads.
"""
from __future__ import annotations

import torch
from torch._guards import active_fake_mode
from torch._higher_order_ops.utils import _from_fun
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

# id(state tensor) -> (the tensor, its probe, the probe's layout when made, the fake mode it
# belongs to); the tensor is held so that its id stays its own. Probes are reused by every
# branch of one capture.
_PROBES: dict[int, tuple[torch.Tensor, torch.Tensor, tuple, object]] = {}


def probes(state: list[torch.Tensor]) -> list[torch.Tensor]:
    """One probe per state tensor, made as torch.cond makes its branch inputs (`_from_fun`)."""
    mode = active_fake_mode()
    out = []
    with torch._C.DisableTorchFunction():  # plain metadata reads, not seen by export's modes
        for t in state:
            hit = _PROBES.get(id(t))
            # a branch may have changed a probe in place (`t_()`): reuse one only while unchanged
            if hit is None or hit[3] is not mode or _layout(hit[1]) != hit[2]:
                with disable_proxy_modes_tracing():
                    probe = _from_fun(t)
                hit = _PROBES[id(t)] = (t, probe, _layout(probe), mode)
            out.append(hit[1])
    return out


def _layout(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.dtype, t.requires_grad


def forget() -> None:
    """Drop the probes (at the end of a capture: they belong to its fake mode)."""
    _PROBES.clear()


def lift(gm: torch.fx.GraphModule, stand_ins: list[torch.Tensor], start: int) -> list[int]:
    """Turn the tensor constants of `gm` that are probes into placeholders after its own.

    `stand_ins[k]` is the probe of operand `start + k`; returns the operand index of every new
    placeholder, in order. The graph's other constants are left alone.
    """
    where = {id(p): start + k for k, p in enumerate(stand_ins)}
    found: dict[int, list[torch.fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr" and isinstance(node.target, str):
            k = where.get(id(getattr(gm, node.target, None)))
            if k is not None:
                found.setdefault(k, []).append(node)
    if not found:
        return []
    last = [n for n in gm.graph.nodes if n.op == "placeholder"][-1:]
    order = sorted(found)
    anchor = last[0] if last else None
    for k in order:
        if anchor is None:
            with gm.graph.inserting_before(next(iter(gm.graph.nodes))):
                ph = gm.graph.placeholder(f"state_{k}")
        else:
            with gm.graph.inserting_after(anchor):
                ph = gm.graph.placeholder(f"state_{k}")
        for node in found[k]:
            ph.meta = ph.meta or dict(node.meta)
            node.replace_all_uses_with(ph)
            target = node.target
            gm.graph.erase_node(node)
            if hasattr(gm, target):
                delattr(gm, target)
        anchor = ph
    gm.recompile()
    return order
