"""What every body of one emitted program shares: state names, standard layers, instance bodies."""
from __future__ import annotations

import inspect
import os
from typing import Any

import torch
import torch.fx

from dycl_jax.emit import hierarchy
from dycl_jax.emit.bodies import Body, call_io, forward_params
from dycl_jax.emit.layers import TORCH_NAMES, Layer, match
from dycl_jax.emit.ops import KEYS, Expr
from dycl_jax.errors import DyclError, Location
from dycl_jax.lower.interpreter import node_frames, node_location


class Program:
    """Module classes by path, state by placeholder, and the layers and bodies found so far."""

    def __init__(self, gm: torch.fx.GraphModule | list[torch.fx.GraphModule], classes: dict[str, type],
                 state: dict[str, torch.Tensor], refs: dict[torch.fx.Node, str], updated: tuple[str, ...] = ()):
        self.classes = classes
        self.updated = set(updated)  # state a train-mode call writes (nnx.BatchStat): torch paths
        self.keyed_calls: set[str] = set()  # instances whose __call__ takes the call's random keys
        self.state = state  # torch path -> tensor (torch layout)
        self.refs = dict(refs)  # placeholder -> torch state path
        self.raw: dict[str, None] = {}  # state read as plain arrays (not through a Flax layer), in order
        self.bodies: dict[str, tuple[list[str], list[str]]] = {}  # instance path -> (params, body lines)
        self.aliases: dict[str, str] = {}  # call path -> the path its layer's weights live under
        # module path -> the local name holding it in the body being written (a dispatch region's module input)
        self.bound: dict[str, str] = {}
        graphs = gm if isinstance(gm, list) else [gm]  # a dispatch host's regions: one program of many graphs
        for g in graphs:
            self._map_branches(g)
        self.layers: dict[str, Layer] = self._find_layers(graphs)

    # ---- state -------------------------------------------------------------------------
    def state_of(self, node: Any) -> str | None:
        return self.refs.get(node) if isinstance(node, torch.fx.Node) else None

    def alias_state(self, placeholder: torch.fx.Node, path: str) -> None:
        self.refs[placeholder] = path

    def state_expr(self, path: str, context: str) -> str:
        owner, _, leaf = path.rpartition(".")
        layer = self.layers.get(owner)
        if layer is not None and leaf in TORCH_NAMES[layer.kind]:
            attr, fmt = TORCH_NAMES[layer.kind][leaf]
            return fmt.format(f"{self.ref(owner, context)}.{attr}[...]")
        self.raw[path] = None
        return f"{self.ref(path, context)}[...]"

    def ref(self, path: str, context: str) -> str:
        """`path` from a body in module `context`: through a bound local name where one holds it."""
        for held, name in self.bound.items():
            inside = context == held or context.startswith(held + ".")
            if not inside and (path == held or path.startswith(held + ".")):
                return name + hierarchy.relative(path, held)[len("self"):] if path != held else name
        return hierarchy.relative(path, context)

    def layer_of(self, call: hierarchy.Call) -> Layer | None:
        return self.layers.get(self.aliases.get(call.path, call.path))

    # ---- layers and calls --------------------------------------------------------------
    def _map_branches(self, gm: torch.fx.GraphModule) -> None:
        # a branch or loop graph gets the state it reads as operands: its placeholders are that state
        for node in gm.graph.nodes:
            if node.op != "call_function" or node.target not in (torch.ops.higher_order.cond,
                                                                  torch.ops.higher_order.while_loop):
                continue
            if node.target is torch.ops.higher_order.cond:
                graphs, operands = node.args[1:3], list(node.args[3])
            else:
                graphs, operands = node.args[0:2], list(node.args[2]) + list(node.args[3])
            for g in graphs:
                sub = getattr(gm, str(g.target))
                phs = [n for n in sub.graph.nodes if n.op == "placeholder"]
                for ph, op in zip(phs, operands):
                    if self.state_of(op) is not None:
                        self.refs[ph] = self.state_of(op)
                self._map_branches(sub)

    def _find_layers(self, graphs: list[torch.fx.GraphModule]) -> dict[str, Layer]:
        # every call of a torch leaf module must fit the same standard layer, else it keeps jnp code
        by_key: dict[tuple[str, str], list[torch.fx.Node]] = {}
        for sub in (s for g in graphs for s in g.modules()):
            if isinstance(sub, torch.fx.GraphModule):
                for n in sub.graph.nodes:
                    entries = hierarchy.stack(n, self.classes) if n.op == "call_function" else None
                    if entries:
                        by_key.setdefault(entries[-1], []).append(n)
        found: dict[str, list[Layer | None]] = {}
        shape = lambda p: tuple(self.state[p].shape) if p in self.state else ()  # noqa: E731
        f32 = lambda p: all(t.dtype == torch.float32 for k, t in self.state.items()  # noqa: E731
                           if k.startswith(p + ".") and t.is_floating_point())
        state = self._state_by_name()
        for (key, path), nodes in by_key.items():
            cls = self.classes.get(path)
            # a module registered twice (`self.ds = block.downsample`) reads its weights under the first path
            owners = {r.rpartition(".")[0] for n in nodes for a in n.all_input_nodes if (r := state(a))}
            home = owners.pop() if len(owners) == 1 else path
            if home != path and self.classes.get(home) is cls:
                self.aliases[path] = home
            found.setdefault(home, []).append(match(cls, home, nodes, state, shape, f32) if cls else None)
        layers = {p: ls[0] for p, ls in found.items()
                  if ls[0] is not None and all(x is not None and x.fields == ls[0].fields for x in ls)}
        self.aliases = {p: q for p, q in self.aliases.items() if q in layers}
        return layers

    def _state_by_name(self) -> Any:
        # before any body runs, branch placeholders are not yet mapped: follow cond operands by name
        top = {n.name: p for n, p in self.refs.items()}
        return lambda v: (self.refs.get(v) or top.get(getattr(v, "name", None))) if isinstance(v, torch.fx.Node) else None

    def inline(self, call: hierarchy.Call) -> bool:
        """Whether a module call is written into its caller rather than as `self.<path>(...)`."""
        if self.layer_of(call) is not None:
            return False
        cls = self.classes.get(call.path)
        if cls is None or cls.__module__.startswith("torch."):
            return True  # torch's own modules without a Flax layer: their ops, inline
        inputs, outputs = call_io(call, self.state_of)
        refs = [self.state_of(r) for n in call.nodes for r in n.all_input_nodes]
        if any(r is not None and not r.startswith(call.path + ".") for r in refs) or not outputs:
            return True  # reads another module's weights (shared modules): the caller holds both
        call.items = hierarchy.build(call.nodes, call.path, self.inline, self.classes)
        params = forward_params(cls, len(inputs)) or [f"x{k}" for k in range(len(inputs))]
        body = Body(self, call.path, call.nodes[0].graph.owning_module, reserved=set())
        for node, name in zip(inputs, params):
            body.env[node] = Expr(name)
            body.holder[name] = node
        exprs = body.run(call.items, outputs)
        if body.keyed:
            params = params + [KEYS]
            self.keyed_calls.add(call.path)
        text = (params, body.lines + [f"return {', '.join(str(e) for e in exprs)}"])
        if self.bodies.setdefault(call.path, text) != text:
            return True  # the same instance runs different code at two calls: keep each inline
        return False

    def call_location(self, call: hierarchy.Call) -> Location | None:
        if self.layer_of(call) is not None:
            return node_location(call.nodes[0])  # torch's frames are skipped: this is the caller's line
        cls = self.classes.get(call.path)
        try:
            file = inspect.getsourcefile(cls)
            lines, start = inspect.getsourcelines(cls)
        except (TypeError, OSError):
            return None
        frames = node_frames(call.nodes[-1])
        inside = [k for k, f in enumerate(frames)
                  if file and os.path.samefile(f.file, file) and start <= f.line < start + len(lines)] \
            if file and os.path.exists(file) else []
        return frames[inside[0] - 1] if inside and inside[0] > 0 else None

    def no_rule(self, node: torch.fx.Node, what: str) -> DyclError:
        return DyclError(f"emitted source: no emission rule for {what}", location=node_location(node),
                         fix="the in-memory JaxModel runs this op; add a rule to dycl_jax/emit/ops.py to emit it")
