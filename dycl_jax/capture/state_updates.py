"""In-place updates of the model's own tensors in eval mode (a buffer `self.calls += 1`, a tensor
attribute `self.t.add_(1)`): torch keeps the new value for the next call, while a converted model
starts every call from the values at conversion and its compiled programs never write the model.
Found by the version counters of every parameter, buffer and tensor attribute around the
example's eager call (carried_state.py), put back, and refused at the line that made the update."""
from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch.overrides import TorchFunctionMode

from dycl_jax.errors import DyclError, Location, limitation

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # dycl_jax/
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))


@dataclass
class Versions:
    model: torch.nn.Module
    names: list[str]
    tensors: list[torch.Tensor]
    versions: list[int]


@dataclass
class Saved(Versions):
    values: list[torch.Tensor | None]  # None for a parameter


def module_tensors(model: torch.nn.Module, attributes: bool = True) -> list[tuple[str, torch.Tensor]]:
    """Every parameter, buffer and (with `attributes`) plain tensor attribute, once per tensor, by
    its first name."""
    out: dict[int, tuple[str, torch.Tensor]] = {}
    for path, m in model.named_modules(remove_duplicate=False):
        prefix = f"{path}." if path else ""
        found = [*m._parameters.items(), *m._buffers.items(),
                 *((k, v) for k, v in vars(m).items() if attributes and isinstance(v, torch.Tensor))]
        for k, t in found:
            if isinstance(t, torch.Tensor):
                out.setdefault(id(t), (prefix + k, t))
    return list(out.values())


def versions(model: torch.nn.Module) -> Versions:
    """Each module tensor and its version counter (no copies: cheap enough to take per statement)."""
    found = module_tensors(model)
    return Versions(model, [n for n, _ in found], [t for _, t in found], [t._version for _, t in found])


def save(model: torch.nn.Module) -> Saved:
    """Versions, and copies of the buffers and tensor attributes (parameters, most of the memory,
    are not copied: an eval-mode forward that updates one in place is refused all the same, but
    left as it made it)."""
    v = versions(model)
    params = {id(p) for p in model.parameters()}
    with torch.no_grad():
        return Saved(v.model, v.names, v.tensors, v.versions,
                     [None if id(t) in params else t.detach().clone() for t in v.tensors])


def updated(before: Versions) -> list[str]:
    """Names of the tensors updated in place, or (parameters and buffers) bound to another tensor,
    since `before`. (A plain attribute bound to another tensor is carried_state.py's concern: it
    compares the results of two calls.)"""
    registered = dict(module_tensors(before.model, attributes=False))
    return [n for n, t, v in zip(before.names, before.tensors, before.versions)
            if t._version != v or n in registered and registered[n] is not t
            or n not in registered and _was_registered(before.model, n)]


def _was_registered(model: torch.nn.Module, name: str) -> bool:
    """A buffer or parameter `name` that is no longer one (deleted or replaced by an attribute)."""
    path, _, key = name.rpartition(".")
    try:
        m = model.get_submodule(path) if path else model
    except AttributeError:
        return True
    return key not in m.__dict__


def restore(saved: Saved) -> None:
    """Put back every tensor's value and binding."""
    now = dict(module_tensors(saved.model))
    with torch.no_grad():
        for name, t, value, version in zip(saved.names, saved.tensors, saved.values, saved.versions):
            if t._version != version and value is not None:
                t.copy_(value)
            if now.get(name) is not t:
                rebind(saved.model, name, t)


def rebind(model: torch.nn.Module, name: str, t: torch.Tensor) -> None:
    path, _, key = name.rpartition(".")
    m = model.get_submodule(path) if path else model
    for container in (m._parameters, m._buffers):
        if key in container:
            container[key] = t  # type: ignore[assignment]
            return
    m.__dict__[key] = t


class _FirstUpdate(TorchFunctionMode):
    """Records the innermost user frame of the first op that updates a watched tensor in place."""

    def __init__(self, watched: list[torch.Tensor]) -> None:
        super().__init__()
        self.watched = {id(t) for t in watched}
        self.frame: traceback.FrameSummary | None = None

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        hit = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and id(t) in self.watched]
        before = [t._version for t in hit]
        out = func(*args, **kwargs)
        if self.frame is None and any(t._version != v for t, v in zip(hit, before)):
            user = [f for f in traceback.extract_stack()[:-1]
                    if not os.path.abspath(f.filename).startswith((_PACKAGE, _TORCH))]
            self.frame = user[-1] if user else None
        return out


def locate(fn: Callable, args: tuple, saved: Saved) -> Location | None:
    """Run `fn(*args)` again (state put back first and after) to find the update's line."""
    restore(saved)
    mode = _FirstUpdate(saved.tensors)
    try:
        with mode:
            fn(*args)
    except Exception:  # noqa: BLE001  (only the line is wanted here)
        pass
    finally:
        restore(saved)
    f = mode.frame
    return Location(f.filename, f.lineno or 0, f.line or "") if f is not None else None


def refusal(names: list[str], location: Location | None) -> DyclError:
    return DyclError(
        f"the method updates the model's tensor `{names[0]}` in place"
        + (f" (and {', '.join(f'`{n}`' for n in names[1:4])})" if len(names) > 1 else "")
        + " in eval mode: torch keeps the new value for the next call, while a converted model starts every "
          "call from the values at conversion and never writes the model's tensors",
        location=location,
        fix=limitation(f"in-place updates of the model's own tensors (`{names[0]}`) outside training mode",
                       "dycl_jax/capture/state_updates.py"))
