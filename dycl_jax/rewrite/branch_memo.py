"""One graph per distinct branch: a later branch that does what an earlier one did reuses its trace.

Tracing a branch to a graph (`staged.trace`, torch's make_fx) costs far more than running its
Python on fake tensors. So while a branch is traced, every torch call it makes is recorded
(a torch-function mode): the function, each argument (a tensor by its role: user operand k, the
r-th model state tensor read, or output j of call i; anything else by value), each result by the
same encoding, the grad and autocast modes, and the Python frames between the branch and the call
(code object, line, the type of every module `self` on the way). The graph make_fx builds is a
function of exactly that sequence and of the operands' metadata (shapes, strides, dtypes,
requires_grad): a later branch whose Python, run without tracing, records an equal *key* gets a
copy of the first graph with its own state tensors substituted, its own output values (Python
ints it returns differ from block to block) and its node metadata translated (each node's
module path names the later block's module). Anything the encoding does not know (an unknown
object or tensor, a nested staged construct, a state write, a graph holding constants) makes the
branch traced as before.
"""
from __future__ import annotations

import dataclasses
import sys
import types
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode


class Unrecordable(Exception):
    """The branch does something the key cannot describe: it is traced, not reused."""


_ACTIVE: list["Recorder"] = []


def nested() -> None:
    """Called by every staged construct: one inside a recorded branch makes it unrecordable
    (its graph holds sub-graphs the key does not describe)."""
    for rec in _ACTIVE:
        rec.ok = False
        if rec.light:
            raise Unrecordable("nested construct")


def _layout(t: torch.Tensor) -> tuple:
    return (tuple(str(d) for d in t.shape), tuple(str(s) for s in t.stride()), t.dtype, t.device,
            t.layout, t.requires_grad, type(t).__name__)


_ATOMS = (bool, int, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


class Recorder(TorchFunctionMode):
    """Records the torch calls a branch makes, between `Operands.call` and the call."""

    def __init__(self, user: tuple, probes: list[torch.Tensor], boundary: types.CodeType, light: bool) -> None:
        super().__init__()
        self.roles: dict[int, tuple] = {id(t): ("u", k) for k, t in enumerate(user)}
        self.probe_at = {id(p): k for k, p in enumerate(probes)}
        self.seen_state: list[int] = []  # probe index (state operand - n) in first-read order
        self.keep: list[Any] = [*user, *probes]  # every tensor given a role stays alive: ids stay unique
        self.calls: list[tuple] = []
        self.modules: list[torch.nn.Module] = []  # each `self` module met on the way, in order
        self.boundary = boundary
        self.light = light
        self.ok = True
        self.head = (tuple(_layout(t) for t in user),)

    def __enter__(self) -> "Recorder":
        _ACTIVE.append(self)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.remove(self)
        return super().__exit__(*exc)

    def _tensor(self, t: torch.Tensor) -> tuple:
        role = self.roles.get(id(t))
        if role is None:
            k = self.probe_at.get(id(t))
            if k is None:
                raise Unrecordable("a tensor from outside the branch's operands")
            role = self.roles[id(t)] = ("s", len(self.seen_state), _layout(t))
            self.seen_state.append(k)
        return role

    def enc(self, v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return self._tensor(v)
        if isinstance(v, _ATOMS):
            return (type(v), v)
        if isinstance(v, (float, complex)):
            return (type(v), repr(v))  # nan, -0.0: exactly
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return (type(v), str(v))
        if isinstance(v, (tuple, list)):
            return (type(v), tuple(self.enc(x) for x in v))
        if isinstance(v, dict):
            return (dict, tuple((self.enc(k), self.enc(x)) for k, x in v.items()))
        if isinstance(v, slice):
            return (slice, self.enc(v.start), self.enc(v.stop), self.enc(v.step))
        if v is Ellipsis:
            return (type(v),)
        raise Unrecordable(f"a {type(v).__name__} value")

    def _result(self, v: Any, at: tuple) -> Any:
        if isinstance(v, torch.Tensor):
            role = self.roles.get(id(v))
            if role is not None:
                return ("same", role)
            self.roles[id(v)] = at
            self.keep.append(v)
            return ("new", _layout(v))
        if isinstance(v, (tuple, list)):
            return (type(v), tuple(self._result(x, (*at, i)) for i, x in enumerate(v)))
        return self.enc(v)

    def _frames(self) -> tuple:
        out = []
        frame = sys._getframe(2)
        while frame is not None and frame.f_code is not self.boundary:
            code = frame.f_code
            owner = frame.f_locals.get("self") if code.co_varnames[:1] == ("self",) else None
            if isinstance(owner, torch.nn.Module):
                self.modules.append(owner)
                out.append((code, frame.f_lineno, type(owner)))
            else:
                out.append((code, frame.f_lineno))
            frame = frame.f_back
        if frame is None:
            raise Unrecordable("a call from outside the branch")
        return tuple(out)

    def __torch_function__(self, func: Callable, types_: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if not self.ok:
            return func(*args, **kwargs)
        try:
            entry = (func, self.enc(args), self.enc(kwargs), torch.is_grad_enabled(), torch.is_autocast_enabled(),
                     torch.is_inference_mode_enabled(), self._frames())
        except Unrecordable:
            if self.light:
                raise
            self.ok = False
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        try:
            self.calls.append((*entry, self._result(out, ("r", len(self.calls)))))
        except Unrecordable:
            if self.light:
                raise
            self.ok = False
        return out

    def finish(self, flat: list[Any]) -> tuple:
        """The key: the operands' layouts, every call, and the role of each tensor output."""
        outs = tuple(self._tensor(v) if isinstance(v, torch.Tensor) else None for v in flat)
        return (*self.head, tuple(self.calls), outs)


@dataclasses.dataclass
class Entry:
    """A traced branch's graph, what its placeholders stand for, and what translates it."""

    gm: torch.fx.GraphModule
    inputs: list[int]  # operand per placeholder
    n_user: int
    seen_state: list[int]
    modules: list[torch.nn.Module]


def _names(roots: list[torch.nn.Module]) -> dict[int, list[str]]:
    names: dict[int, list[str]] = {}
    for root in roots:
        for name, m in root.named_modules(remove_duplicate=False):
            names.setdefault(id(m), []).append(name)
    return names


def _path_map(old: list[torch.nn.Module], new: list[torch.nn.Module], roots: list[torch.nn.Module]) -> dict[str, str]:
    """Module name of each module met in the first branch -> that of its counterpart in the later
    one; raises Unrecordable where the pairing is not one to one or a module has several names."""
    pairs: dict[int, torch.nn.Module] = {}
    back: dict[int, int] = {}
    for a, b in zip(old, new, strict=True):
        if pairs.setdefault(id(a), b) is not b or back.setdefault(id(b), id(a)) != id(a):
            raise Unrecordable("modules paired differently")
    names = _names(roots)
    out: dict[str, str] = {}
    for a in old:
        na, nb = names.get(id(a), []), names.get(id(pairs[id(a)]), [])
        if len(na) != 1 or len(nb) != 1:
            raise Unrecordable("a module under several names")
        out[na[0]] = nb[0]
    return out


def _translate(path: str, table: dict[str, str]) -> str:
    best = ""
    for old in table:  # the longest module name the path ends with, after a dot
        if len(old) > len(best) and (path == old or path.endswith("." + old)):
            best = old
    if not best and "" not in table:
        return path
    return path[: len(path) - len(best)] + table[best]


def reuse(entry: Entry, rec: Recorder, roots: list[torch.nn.Module]) -> tuple[torch.fx.GraphModule, list[int]]:
    """A copy of `entry`'s graph for the branch `rec` recorded, and the operand of each placeholder."""
    table = _path_map(entry.modules, rec.modules, roots)
    state = dict(zip(entry.seen_state, rec.seen_state, strict=True))
    n = entry.n_user
    inputs = [i if i < n else n + state[i - n] for i in entry.inputs]
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(entry.gm.graph, {}))
    for node in graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if stack:
            node.meta["nn_module_stack"] = type(stack)(
                (_translate(k, table), (_translate(p, table), t)) for k, (p, t) in stack.items())
    copy = torch.fx.GraphModule(entry.gm, graph)
    copy.meta = dict(entry.gm.meta)
    return copy, inputs


def shareable(gm: torch.fx.GraphModule) -> bool:
    """A graph whose copy computes the same on other operands: no attribute (constant) reads."""
    return not any(node.op == "get_attr" for node in gm.graph.nodes)


_MEMO: dict[tuple, Entry] = {}
_KINDS: set[tuple] = set()  # (branch code, outer frames) of every entry: only these are run untraced


def outer_frames(depth: int) -> tuple:
    """Where the branch is traced from (the stack traces of its nodes include these frames)."""
    out, frame = [], sys._getframe(depth + 1)
    while frame is not None:
        out.append((frame.f_code, frame.f_lineno))
        frame = frame.f_back
    return tuple(out)


def known(kind: tuple) -> bool:
    return kind in _KINDS


def remember(kind: tuple, key: tuple, entry: Entry) -> None:
    _MEMO.setdefault((kind, key), entry)
    _KINDS.add(kind)


def lookup(kind: tuple, key: tuple) -> Entry | None:
    return _MEMO.get((kind, key))


def forget() -> None:
    """Drop the graphs (at the end of a capture: they belong to its fake mode)."""
    _MEMO.clear()
    _KINDS.clear()
