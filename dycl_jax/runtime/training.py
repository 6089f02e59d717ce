"""TrainingJaxModel: a method converted with `train=True` (batch statistics, random ops)."""
from __future__ import annotations

from typing import Any, Callable

from flax import nnx

from dycl_jax.errors import CallError
from dycl_jax.lower.int_ranges import int_scope
from dycl_jax.lower.ops.control_flow import differentiable
from dycl_jax.rewrite.decisions import Decision
from dycl_jax.rewrite.regions import recording_decisions
from dycl_jax.runtime.model import JaxModel
from dycl_jax.runtime.signature import CallSignature
from dycl_jax.runtime.state import flat_values, with_values

KeyedFn = Callable[[list[Any], list[Any], Any], tuple[tuple[Any, ...], tuple[Any, ...]]]


class TrainingJaxModel(JaxModel):
    """`jm(*args, key=None)` updates the BatchNorm statistics in `jm.module` (`nnx.BatchStat`
    variables) as torch's forward in training mode does, and returns the outputs;
    `jm.apply(state, *args, key=k)` is the pure form, returning `(outputs, new_state)`.

    Random ops (dropout, bernoulli, rand, ...) draw from `key`; `jm(...)` without one takes the
    next key of `jm.rngs.dropout` (an `nnx.Rngs`), so successive calls draw fresh masks.

    On the dispatch host (`host="dispatch"`) `fn` is the host's `train_call`: control flow runs
    in Python, each region updating the statistics as it runs (host/training.py); `updated`
    lists every buffer, since which of them a call updates depends on its path.
    """

    def __init__(self, module: nnx.Module, variables: list[nnx.Variable], paths: list[str], fn: KeyedFn,
                 signature: CallSignature, updated: list[str], rngs: nnx.Rngs, x64: bool = False,
                 host: str = "staged"):
        super().__init__(module, variables, paths, fn, signature, host, jit=host == "staged",  # type: ignore[arg-type]
                         structured=host == "dispatch", x64=x64)
        self.rngs = rngs
        self.updated_paths = list(updated)  # the buffers a call updates, in the program's order
        self._updated = [paths.index(p) for p in updated]

    def _key(self, key: Any) -> Any:
        return self.rngs.dropout() if key is None else key

    def __call__(self, *args: Any, key: Any = None) -> Any:  # type: ignore[override]
        with int_scope(self.x64):
            outs, new = self._call(self._state_values(), self.signature.bind(args), self._key(key))
        for i, value in zip(self._updated, new):
            self._variables[i].set_raw_value(value)
        return self._unflatten(outs)

    def apply(self, state: nnx.State, *args: Any, key: Any = None) -> tuple[Any, nnx.State]:  # type: ignore[override]
        """Pure and jittable: `(outputs, new_state)`, new_state being `state` with the updated
        statistics. Random ops need `key` (on the dispatch host every call does: which regions
        draw is known only as they run). Differentiable as `JaxModel.apply`."""
        if key is None and self.host == "dispatch":
            raise CallError("jm.apply of a train=True model on the dispatch host needs a key",
                            fix="pass key=jax.random.key(seed)")
        with int_scope(self.x64):
            tensors = self.signature.bind(args)
            with differentiable():
                outs, new = self._fn(flat_values(state, self._paths), tensors, key)
        updates = {self._paths[i]: v for i, v in zip(self._updated, new)}
        return self._unflatten(outs), with_values(state, updates)

    def trace_batch(self, *args: Any, capacity: int = 1024) -> tuple[Any, list[list[Decision]]]:
        """Not for a train=True model: its `apply` takes a key and returns updated statistics."""
        raise CallError("trace_batch vmaps an inference program; this model was converted with train=True",
                        fix="convert with train=False for batched decision traces, or call jm.trace per sample")

    def trace(self, *args: Any, key: Any = None) -> tuple[Any, list[Decision]]:  # type: ignore[override]
        """(outputs, decisions) as `JaxModel.trace`; the module's statistics are left as they are."""
        with int_scope(self.x64):
            if self.host == "dispatch":  # the host records its decisions (and its regions') as it goes
                with recording_decisions() as decisions:
                    outs, _ = self._call(self._state_values(), self.signature.bind(args), self._key(key))
                return outs, list(decisions)
            return self._traced(args, self._key(key))

    def to_source(self) -> str:
        """The training-mode program as Flax NNX source: its `__call__` takes `key=` (or `rngs=`,
        else draws from the module's `rngs`) as this model does, and writes the updated BatchNorm
        statistics (`nnx.BatchStat`) into the module. On the dispatch host each compiled region
        method takes its region key and writes the statistics it updates (emit/hosted_train.py)."""
        return super().to_source()

    def emit(self, out_dir: str) -> str:
        """Write the training-mode module (see to_source) and its weights to `out_dir`."""
        return super().emit(out_dir)

    def _host_object(self) -> Any:
        # on the dispatch host `fn` is the host's train_call with the updated buffers bound
        return self._fn.func.__self__ if self.host == "dispatch" else self._fn

    def padded(self, *args: Any) -> Any:
        raise CallError("a model converted with train=True has no padded form", fix="call jm(...) or jm.apply(...)")

    def _traced_outputs(self, outs: Any) -> Any:
        return self.signature.unflatten(outs[0])
