"""A decision recorder held in program values: a fixed-size log the traced program returns.

`JaxModel.trace` reports decisions with `jax.debug.callback`, which a serialized program
(`jax.export`) cannot hold. Under a `DecisionLog` the control-flow lowerings instead append
(site id, value, margin) to arrays threaded through every `lax.cond` (an extra operand and
result) and `lax.while_loop` (an extra carry), so the log is an ordinary output and the
traced program serializes like the plain one. The log has a fixed capacity; `count` keeps
counting past it so a reader can tell that entries were dropped.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import jax.numpy as jnp

Log = tuple[Any, Any, Any, Any]  # (site ids int32[C], values int32[C], margins float32[C], count int32)


class DecisionLog:
    """Collects the site table while JAX traces; holds the log of the scope being traced."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.sites: list[tuple[str, str]] = []  # (site label, "bool" | "int"), indexed by site id
        self.log: Log | None = None
        self._muted = 0

    def start(self) -> None:
        c = self.capacity
        self.log = (jnp.full((c,), -1, jnp.int32), jnp.zeros((c,), jnp.int32),
                    jnp.full((c,), jnp.nan, jnp.float32), jnp.zeros((), jnp.int32))

    @property
    def active(self) -> bool:
        """Whether appends are taken now (not inside a while test, which cannot return values)."""
        return self.log is not None and not self._muted

    @contextlib.contextmanager
    def muted(self) -> Iterator[None]:
        self._muted += 1
        try:
            yield
        finally:
            self._muted -= 1

    def site_id(self, site: str, value: Any) -> int:
        key = (site, "bool" if jnp.asarray(value).dtype == jnp.bool_ else "int")
        if key not in self.sites:
            self.sites.append(key)
        return self.sites.index(key)

    def append(self, site: str, value: Any, margin: Any, when: Any = None) -> None:
        """Log (site, value, margin); with `when` (a 0-d bool array), only where it is true."""
        if not self.active:
            return
        ids, values, margins, count = self.log  # type: ignore[misc]
        # past the capacity the writes are dropped; count still says how many were made; an
        # entry not taken is written past the end (dropped) and not counted
        at = count if when is None else jnp.where(when, count, self.capacity)
        ids = ids.at[at].set(self.site_id(site, value), mode="drop")
        values = values.at[at].set(jnp.asarray(value).reshape(()).astype(jnp.int32), mode="drop")
        margins = margins.at[at].set(jnp.asarray(margin, jnp.float32).reshape(()), mode="drop")
        self.log = (ids, values, margins, count + (1 if when is None else jnp.asarray(when, jnp.int32)))
