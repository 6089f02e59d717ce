"""Host statements run the user's torch code, which reads the model's weights from the torch
module: under `jm.apply(state, ...)` with other values (fine-tuned in JAX, say) they must see
those values, as the compiled regions do."""
from __future__ import annotations

import contextlib
from itertools import chain
from typing import Any, ContextManager, Sequence

import jax
import torch
from torch.nn.utils import stateless

from dycl_jax.capture import state_updates
from dycl_jax.errors import Location
from dycl_jax.host import values
from dycl_jax.rewrite.attribute_watch import identical


class ModuleState:
    """Which of the module's parameters and buffers a call's state values replace."""

    def __init__(self, root: torch.nn.Module, path_index: dict[str, int]) -> None:
        self.root = root
        self.paths = path_index  # state path ("layers.0.weight") -> index into the state values
        self._own = dict(root.named_parameters(remove_duplicate=False))
        self._own.update(root.named_buffers(remove_duplicate=False))
        self._watched: state_updates.Versions | None = None  # the module's tensors (`watch`)
        self._slots: list[dict] = []
        # the last state seen (kept, so its ids stay valid) and the torch values that differ in it
        self._last: tuple[Sequence[Any], dict[str, torch.Tensor]] | None = None

    def swapped(self, state: Sequence[Any]) -> ContextManager:
        """The module with the state's values where they differ from its own (usually none)."""
        if self._last is None or len(self._last[0]) != len(state) \
                or any(a is not b for a, b in zip(self._last[0], state)):
            self._last = (list(state), self._differing(state))
        changed = self._last[1]
        return stateless._reparametrize_module(self.root, changed) if changed else contextlib.nullcontext()

    def _differing(self, state: Sequence[Any]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for path, i in self.paths.items():
            if isinstance(state[i], jax.core.Tracer):
                # under jax.grad / jit of jm.apply: no concrete value to give torch; the host
                # statement keeps the module's own (a transformation through it is refused when
                # its inputs are traced, dispatch._eager)
                continue
            own, value = self._own.get(path), values.to_torch(state[i])
            if not isinstance(value, torch.Tensor):
                continue
            if own is None or own.shape != value.shape or not torch.equal(own.detach(), value.to(own.dtype)):
                out[path] = value if own is None else value.to(own.dtype)
        return out

    def watch(self) -> tuple[tuple[int, ...], tuple]:
        """Before a host statement runs (per call: the module's tensors are listed once): each
        tensor's version, and what the parameter and buffer slots hold."""
        if self._watched is None:
            self._watched = state_updates.versions(self.root)
            self._slots = [d for m in self.root.modules() for d in (m._parameters, m._buffers)]
        return tuple(t._version for t in self._watched.tensors), self._bound()

    def _bound(self) -> tuple:
        return tuple(chain.from_iterable(map(dict.values, self._slots)))

    def refuse_updates(self, before: tuple[tuple[int, ...], tuple], location: Location, state: Sequence[Any]) -> None:
        """Refuse a host statement that updated one of the module's tensors (eval mode): the
        compiled regions read the call's state values, never the torch module, and torch would keep
        the value for the next call. The module gets back the values it had (the state's)."""
        w = self._watched
        versions, bound = before
        if w is None or tuple(t._version for t in w.tensors) == versions and identical(self._bound(), bound):
            return
        before = state_updates.Versions(w.model, w.names, w.tensors, list(versions))
        moved = state_updates.updated(before)
        if not moved:
            return
        self._watched = None  # listed again at the next call
        with torch.no_grad():
            for name, t in zip(before.names, before.tensors):
                if name not in moved:
                    continue
                i = self.paths.get(name)
                value = values.to_torch(state[i]) if i is not None else None
                if isinstance(value, torch.Tensor) and value.shape == t.shape:
                    t.copy_(value.to(t.dtype))
                state_updates.rebind(self.root, name, t)
        raise state_updates.refusal(moved, location)
