"""Runs of identical gated blocks as one `lax.scan` over their stacked state.

XLA compiles each of BlockDrop's 54 gated residual blocks on its own when the program holds
them one after another (seconds of compile); as a scan over the blocks' stacked weights the
block is compiled once. `lower/reroll_find.py` finds the runs. Here a `Rerolled` program takes
the state with each run's per-block tensors of one role (block k's `conv1.weight`, ...) as one
stacked array (`groups`); it computes every free node of a run unrolled (the block's slice of
the policy and its test), stacks the values the blocks read, and scans the carried nodes of
one segment (the template) over them. Where a scan cannot stand for the blocks (decisions
being recorded, random keys drawn, blocks whose Python values differ at trace time) it runs
the graph unrolled on the stacked arrays' rows, as the unrolled graph would.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import torch.fx

from dycl_jax.lower.interpreter import LoweredGraph, node_values, run_step
from dycl_jax.lower.keys import current_stream
from dycl_jax.lower.ops.control_flow import is_recording
from dycl_jax.lower.reroll_find import Run, find_runs


class Rerolled:
    """`graph` with its runs as scans: inputs are the kept state, then one array per group, then the rest."""

    def __init__(self, graph: LoweredGraph, n_state: int, runs: list[Run]):
        self.graph = graph
        self.runs = runs
        self.groups = [g for run in runs for g in run.groups]
        stacked = {p for g in self.groups for p in g}
        placeholders = graph.placeholders
        self.kept = [k for k, p in enumerate(placeholders[:n_state]) if p not in stacked]  # state indices
        self.n_state = n_state
        self._step = {s.node: s for s in graph.steps}
        self._start = {run.segments[0][0]: run for run in runs}
        self._inside = {n for run in runs for n in run.nodes}

    @property
    def name(self) -> str:
        return self.graph.name

    def __call__(self, *inputs: Any) -> tuple[Any, ...]:
        g = self.graph
        n_kept, n_groups = len(self.kept), len(self.groups)
        kept, stacks, rest = inputs[:n_kept], inputs[n_kept:n_kept + n_groups], inputs[n_kept + n_groups:]
        env: dict[torch.fx.Node, Any] = {g.placeholders[k]: v for k, v in zip(self.kept, kept)}
        env.update(zip(g.placeholders[self.n_state:], rest))
        env.update(g.attrs)
        load = lambda n: env[n]  # noqa: E731
        if is_recording() or current_stream() is not None:
            # one trace per block: each block's decisions and key draws happen in its own place
            for group, stack in zip(self.groups, stacks):
                env.update((p, stack[k]) for k, p in enumerate(group))
            with node_values(env):
                g._steps(env, load)
        else:
            by_group = dict(zip(self.groups, stacks))
            with node_values(env):
                for step in g.steps:
                    if step.node in self._start:
                        run = self._start[step.node]
                        self._run(run, [by_group[grp] for grp in run.groups], env, load)
                    elif step.node not in self._inside:
                        run_step(step, env, load)
        assert g.output_node is not None
        result = torch.fx.node.map_arg(g.output_node.args[0], load)
        return tuple(result) if isinstance(result, (list, tuple)) else (result,)

    def _run(self, run: Run, stacks: list[Any], env: dict, load: Any) -> None:
        carried = set(run.carried)
        # one gather gives every block its `select(x, dim, t)`, where only the body reads it
        gathered = {q for q in run.gathered if all(u in self._inside and _pos(run, u) in carried
                                                   for seg in run.segments for u in seg[q].users)}
        for seg in run.segments:  # free nodes read only values from before the run and each other
            for q, node in enumerate(seg):
                if q not in carried and q not in gathered and node in self._step:
                    run_step(self._step[node], env, load)
        per_block = [_gather(run, q, env) if q in gathered else [env[seg[q]] for seg in run.segments]
                     for q in run.xs]
        init = [env[run.init[p]] for p in run.carry]
        if not _scannable(per_block, init):
            for group, stack in zip(run.groups, stacks):
                env.update((p, stack[k]) for k, p in enumerate(group))
            for seg in run.segments:
                for q in run.carried:
                    run_step(self._step[seg[q]], env, load)
            return
        final = self._scan(run, per_block, init, stacks, env)
        last = run.segments[-1]
        env.update((last[p], v) for p, v in zip(run.carry, final))

    def _scan(self, run: Run, per_block: list[list[Any]], init: list[Any], stacks: list[Any], env: dict) -> list[Any]:
        # the template is the run's second segment: it reads its predecessor as the carry
        tmpl, before = run.segments[1], run.segments[0]
        carry_nodes = [before[p] for p in run.carry]
        xs_nodes = [tmpl[q] for q in run.xs]
        group_nodes = [grp[1] for grp in run.groups]
        xs = [vals if isinstance(vals, jax.Array) else jnp.stack([jnp.asarray(v) for v in vals]) for vals in per_block]
        init = [jnp.asarray(v) for v in init]

        def body(carry: list[Any], block: tuple[list[Any], list[Any]]) -> tuple[list[Any], None]:
            xs_k, weights_k = block
            local = dict(env)  # values from before the run, shared state, branch graphs
            local.update(zip(carry_nodes, carry))
            local.update(zip(xs_nodes, xs_k))
            local.update(zip(group_nodes, weights_k))
            with node_values(local):
                for q in run.carried:
                    run_step(self._step[tmpl[q]], local, local.__getitem__)
            out = [local[tmpl[p]] for p in run.carry]
            # a scan needs its carry bit-identical from step to step (weak types included)
            return [jnp.asarray(o, dtype=c.dtype).reshape(c.shape) for o, c in zip(out, carry)], None

        # (length: blocks of one shared module stack no weights, and may carry every value)
        final, _ = jax.lax.scan(body, init, (xs, list(stacks)), length=len(run.segments))
        return final


def _pos(run: Run, node: torch.fx.Node) -> int:
    return next(seg.index(node) for seg in run.segments if node in seg)


def _gather(run: Run, q: int, env: dict) -> Any:
    """The blocks' `select(x, dim, t_k)` stacked on a new leading axis: one gather of x."""
    x, dim = (env[a] if isinstance(a, torch.fx.Node) else a for a in run.segments[0][q].args[:2])
    x = jnp.asarray(x)
    dim = dim % x.ndim
    index = jnp.asarray([seg[q].args[2] % x.shape[dim] for seg in run.segments], jnp.int32)
    return jnp.moveaxis(jnp.take(x, index, axis=dim), dim, 0)


def _scannable(per_block: list[Any], init: list[Any]) -> bool:
    """Whether the blocks' values stack: arrays of one shape and dtype (Python values are part of
    a block's program, so blocks whose values differ are not one program)."""
    for vals in per_block:
        if isinstance(vals, jax.Array):
            continue
        if not all(isinstance(v, (jax.Array, jnp.ndarray)) for v in vals):
            return False
        if len({(v.shape, v.dtype) for v in vals}) != 1:
            return False
    return all(isinstance(v, (jax.Array, jnp.ndarray)) for v in init)


def reroll(graph: LoweredGraph, n_state: int) -> Rerolled | None:
    """`graph` with its runs of identical gated blocks as scans, or None where it has none."""
    runs = find_runs(graph.gm, n_state)
    return Rerolled(graph, n_state, runs) if runs else None
