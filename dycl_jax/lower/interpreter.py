"""Turns a torch.fx graph of core-ATen ops into a JAX-traceable function, node by node."""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from dycl_jax.errors import DataDependentError, DyclError, Location, UnsupportedDtypeError, in_package, raised_by_us
from dycl_jax.source import origins
from dycl_jax.lower.loop_bounds import static_trip_bound
from dycl_jax.lower.margins import output_margins
from dycl_jax.lower.dtypes import tensor_to_numpy, to_jax_dtype
from dycl_jax.lower.registry import lookup

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)\n(?P<code>[^\n]*)')
# Frames of torch, of this package, of fx's generated code and of these stdlib files are plumbing;
# the user's line is the innermost frame outside them. Folders are compared as paths, not by a
# name in them, so a user's own folder called `torch` or `dycl_jax` is still the user's.
_TORCH = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
_STDLIB_PLUMBING = frozenset(os.path.realpath(m.__file__) for m in (contextlib, functools))


@functools.lru_cache(maxsize=4096)  # a few files, asked once per frame of every node's trace
def _plumbing(file: str) -> bool:
    if file.startswith("<eval_with_key>"):
        return True
    real = os.path.realpath(file)
    return in_package(file) or in_package(real) or real.startswith(_TORCH) or real in _STDLIB_PLUMBING


_GENERATED = "<dycl-rewrite"  # filename prefix of rewritten methods (see source/origins.py)
_SITE: contextvars.ContextVar[tuple[str, int | None]] = contextvars.ContextVar("dycl_site", default=("?", None))
_NODE: contextvars.ContextVar[torch.fx.Node | None] = contextvars.ContextVar("dycl_node", default=None)
# the values of the graph being run, by node: lets a control-flow lowering read what its
# predicate was computed from (decision margins, lower/margins.py)
_ENV: contextvars.ContextVar[dict | None] = contextvars.ContextVar("dycl_env", default=None)


def _user_frames(node: torch.fx.Node) -> list[tuple[str, int, str]]:
    trace = node.meta.get("stack_trace") or ""
    return [
        (m["file"], int(m["line"]), m["code"])
        for m in _FRAME.finditer(trace)
        if m["file"].startswith(_GENERATED) or not _plumbing(m["file"])
    ]


def user_locations(node: torch.fx.Node) -> list[Location]:
    """The user's frames that produced `node`, innermost first (the report names values by them)."""
    out = []
    for file, line, code in reversed(_user_frames(node)):
        if not file.startswith(_GENERATED):
            out.append(Location(file, line, code))
        elif (loc := origins.resolve(file, line)) is not None:  # a rewritten method: the user's line
            out.append(loc)
    return out


def node_location(node: torch.fx.Node) -> Location | None:
    """The user's file:line that produced `node`, from the stack trace torch.export recorded."""
    locs = user_locations(node)
    return locs[0] if locs else None


def node_frames(node: torch.fx.Node) -> list[Location]:
    """Every user frame of `node`'s stack trace, outermost first, rewritten lines mapped back."""
    out = []
    for file, line, code in _user_frames(node):
        loc = origins.resolve(file, line) if file.startswith(_GENERATED) else Location(file, line, code)
        if loc is not None:
            out.append(loc)
    return out


def node_site(node: torch.fx.Node) -> str:
    """The decision-site label of a control-flow node, as the rewrite stage named it."""
    for file, line, _ in reversed(_user_frames(node)):
        label = origins.site(file, line) if file.startswith(_GENERATED) else None
        if label:
            return label
    loc = node_location(node)
    kind = getattr(node.target, "__name__", str(node.target))
    return f"{kind}@{loc.file.rsplit('/', 1)[-1]}:{loc.line}" if loc else kind


def current_node() -> torch.fx.Node | None:
    """The fx node being lowered right now: lets a lowering read torch's metadata (strides)."""
    return _NODE.get()


def current_env() -> dict | None:
    """The node values of the graph whose node is being lowered right now."""
    return _ENV.get()


def current_site() -> str:
    """The site of the control-flow node being lowered right now (for decision tracing)."""
    return _SITE.get()[0]


def current_loop_bound() -> int | None:
    """The static trip-count bound of the while_loop being lowered right now, if known."""
    return _SITE.get()[1]


def _meta_dtype(val: Any) -> Any:
    """The JAX dtype torch expects for a node's output(s), or None where there is no tensor."""
    if isinstance(val, torch.Tensor):
        return to_jax_dtype(val.dtype)
    if isinstance(val, (list, tuple)):
        return [_meta_dtype(v) for v in val]
    return None


def _reads_unbacked(node: torch.fx.Node) -> bool:
    """Whether an input of the node holds an unbacked symbol: a value torch.export read from
    tensor data (`.item()`, `.tolist()`, `nonzero`'s length)."""
    vals = [a.meta.get("val") for a in node.all_input_nodes]
    return any(free_unbacked_symbols(v) for v in vals if v is not None)


def _located_dtype(node: torch.fx.Node) -> Any:
    """_meta_dtype of the node's result; a dtype JAX lacks is refused at the user's line that made it."""
    try:
        return _meta_dtype(node.meta.get("val"))
    except UnsupportedDtypeError as exc:
        if exc.location is not None:
            raise
        raise UnsupportedDtypeError(exc.message, location=node_location(node), fix=exc.fix) from None


def _cast_like(out: Any, dtype: Any) -> Any:
    # torch's type promotion differs from JAX's (e.g. f16 tensor + f32 0-d tensor stays f16 in
    # torch); casting every result to the dtype torch recorded keeps the two in step.
    if dtype is None:
        return out
    if isinstance(dtype, list):
        if isinstance(out, (list, tuple)) and len(out) == len(dtype):
            return type(out)(_cast_like(o, d) for o, d in zip(out, dtype))
        return out
    if isinstance(out, (jax.Array, jnp.ndarray)) and out.dtype != dtype:
        return out.astype(dtype)
    return out


@dataclass
class _Step:
    node: torch.fx.Node
    fn: Callable[..., Any]
    out_dtype: Any
    site: str | None = None  # set for control-flow nodes only
    loop_bound: int | None = None  # static trip-count bound of a while_loop, if evident


@dataclass
class LoweredGraph:
    """A callable JAX version of one fx graph: inputs are its placeholders, in order."""

    gm: torch.fx.GraphModule
    name: str = "graph"
    steps: list[_Step] = field(default_factory=list)
    placeholders: list[torch.fx.Node] = field(default_factory=list)
    attrs: dict[torch.fx.Node, Any] = field(default_factory=dict)
    output_node: torch.fx.Node | None = None

    @classmethod
    def build(cls, gm: torch.fx.GraphModule, name: str = "graph") -> "LoweredGraph":
        """Resolve every node's lowering now, so a missing op fails at conversion, not call."""
        lg = cls(gm, name)
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                lg.placeholders.append(node)
            elif node.op == "get_attr":
                lg.attrs[node] = _lower_attr(gm, node)
            elif node.op == "call_function":
                fn = lookup(node.target, node_location(node))
                site = node_site(node) if isinstance(node.target, torch._ops.HigherOrderOperator) else None
                bound = static_trip_bound(node, gm) if node.target is torch.ops.higher_order.while_loop else None
                lg.steps.append(_Step(node, fn, _located_dtype(node), site, bound))
            elif node.op == "output":
                lg.output_node = node
            else:
                raise DyclError(f"unexpected fx node kind {node.op} ({node.format_node()})")
        return lg

    def subgraphs(self) -> list["LoweredGraph"]:
        """Branch and loop-body graphs this graph calls (torch.cond / torch.while_loop)."""
        return [a for a in self.attrs.values() if isinstance(a, LoweredGraph)]

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        env = self._run(inputs)
        load = lambda n: env[n]  # noqa: E731
        assert self.output_node is not None
        result = torch.fx.node.map_arg(self.output_node.args[0], load)
        return tuple(result) if isinstance(result, (list, tuple)) else (result,)

    def with_margins(self, *inputs: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """(outputs, per output the margin of a one-element boolean output or None): see
        lower/margins.py; for decision tracing."""
        env = self._run(inputs)
        assert self.output_node is not None
        result = torch.fx.node.map_arg(self.output_node.args[0], lambda n: env[n])
        outs = tuple(result) if isinstance(result, (list, tuple)) else (result,)
        return outs, output_margins(self.output_node, env)

    def _run(self, inputs: tuple) -> dict:
        if len(inputs) != len(self.placeholders):
            raise DyclError(f"{self.name}: expected {len(self.placeholders)} inputs, got {len(inputs)}")
        env: dict[torch.fx.Node, Any] = dict(zip(self.placeholders, inputs))
        env.update(self.attrs)
        load = lambda n: env[n]  # noqa: E731
        env_token = _ENV.set(env)
        try:
            self._steps(env, load)
        finally:
            _ENV.reset(env_token)
        return env

    def _steps(self, env: dict, load: Callable[[Any], Any]) -> None:
        for step in self.steps:
            run_step(step, env, load)


def run_step(step: _Step, env: dict, load: Callable[[Any], Any]) -> None:
    """Run one lowered node on the values in `env` (read through `load`) and store its result there."""
    node = step.node
    args = torch.fx.node.map_arg(node.args, load)
    kwargs = torch.fx.node.map_arg(node.kwargs, load)
    token = _SITE.set((step.site, step.loop_bound)) if step.site else None
    node_token = _NODE.set(node)
    try:
        out = step.fn(*args, **kwargs)
    except DyclError as exc:
        if isinstance(exc, DataDependentError) and not _reads_unbacked(node):
            # the traced bound is a symbolic Python int (the host may make it a constant), not data
            raise DyclError(exc.message, location=exc.location or node_location(node), fix=exc.fix) from None
        if exc.location is None:  # lowerings know the op, the interpreter knows the line
            raise type(exc)(exc.message, location=node_location(node), fix=exc.fix) from exc
        raise
    except Exception as exc:  # re-raise with the node and the user's line, as torch.fx does
        if raised_by_us(exc):  # our bug: it stays itself (never a refusal), told where it arose
            loc = node_location(node)
            where = f" for {loc.file}:{loc.line}" if loc is not None else ""
            exc.add_note(f"raised inside dycl_jax while lowering {node.target}{where}: a dycl_jax bug, please report it")
            raise
        raise DyclError(
            f"lowering {node.target} failed: {type(exc).__name__}: {exc}",
            location=node_location(node),
            fix="this is a dycl_jax bug or an unsupported use of the op; please report it",
        ) from exc
    finally:
        _NODE.reset(node_token)
        if token is not None:
            _SITE.reset(token)
    env[node] = _cast_like(out, step.out_dtype)


@contextlib.contextmanager
def node_values(env: dict) -> Iterator[None]:
    """Make `env` the values control-flow lowerings read (current_env) while a caller runs steps itself."""
    token = _ENV.set(env)
    try:
        yield
    finally:
        _ENV.reset(token)


def _lower_attr(gm: torch.fx.GraphModule, node: torch.fx.Node) -> Any:
    obj: Any = gm
    for part in str(node.target).split("."):
        obj = getattr(obj, part)
    if isinstance(obj, torch.fx.GraphModule):
        return LoweredGraph.build(obj, name=str(node.target))
    if isinstance(obj, torch.Tensor):
        return jnp.asarray(tensor_to_numpy(obj, f"tensor attribute {node.target}"))
    raise DyclError(f"unsupported graph attribute {node.target} of type {type(obj).__name__}")
