"""Per-sample decisions of a vmapped staged program, read from a DecisionLog it returns."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import jax
import numpy as np

from dycl_jax.errors import DyclError
from dycl_jax.lower.decision_log import DecisionLog
from dycl_jax.lower.ops.control_flow import recording
from dycl_jax.rewrite.decisions import Decision

if TYPE_CHECKING:
    from dycl_jax.runtime.model import JaxModel


def batch_tracer(jm: "JaxModel", nargs: int, capacity: int) -> tuple[Callable, DecisionLog]:
    """A jitted `vmap(apply)` over axis 0 of `nargs` arguments that also returns each sample's log.

    Under `apply` the conds are the batchable ones (lower/batching.py), the log one more operand
    and result of each, so the decisions are those of the vmap rule `apply` runs, per sample."""
    log = DecisionLog(capacity)

    def traced(state: Any, *args: Any) -> tuple[Any, Any]:
        log.start()
        with recording(log):
            outs = jm.apply(state, *args)
        return outs, log.log

    return jax.jit(jax.vmap(traced, in_axes=(None,) + (0,) * nargs)), log


def read_logs(log: DecisionLog, logged: Any) -> list[list[Decision]]:
    """Each sample's decisions from the batched (ids, values, margins, count) arrays."""
    ids, values, margins, counts = (np.asarray(a) for a in logged)
    out = []
    for i, n in enumerate(counts):
        if n > log.capacity:
            raise DyclError(f"sample {i} made {n} decisions; the batch trace holds at most {log.capacity}",
                            fix=f"call trace_batch(..., capacity={2 * int(n)})")
        row = []
        for site_id, value, margin in zip(ids[i, :n], values[i, :n], margins[i, :n]):
            site, kind = log.sites[site_id]
            row.append(Decision(site, bool(value) if kind == "bool" else int(value), float(margin)))
        out.append(row)
    return out
