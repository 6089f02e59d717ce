"""Conversion cost: a traced branch takes as graph inputs only the model state it reads, and the
program still equals torch on every path (BlockDrop's ResNet-110 code, nested branches, a loop)."""
from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any

import jax
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dycl_jax
from dycl_jax.report.render import render_report
from dycl_jax.rewrite import staged
from dycl_jax.rewrite.api import run_torch_trace
from examples.dynn import blockdrop110, load
from differential import assert_same  # pytest puts tests/ on sys.path


class _Nested(nn.Module):
    """An inner branch and a loop body that read state their enclosing branch does not."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.outer = nn.Linear(4, 4)
        self.inner = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)  # read by no branch: never a branch input
        self.register_buffer("shift", torch.full((4,), 0.5))
        self.scale = torch.tensor(0.5)  # a plain tensor attribute (a constant, not a buffer)

    def forward(self, x):
        y = self.outer(x)
        if y.sum() > 0:
            if y.mean() > 0.3:
                y = self.inner(y) + self.shift
            else:
                y = y - self.shift
        n = 0
        while y.abs().sum() > 2.0 and n < 4:
            y = self.inner(y) * self.scale
            n += 1
        return y, y.sum() * n


def _convert_watching(model: nn.Module, args: tuple) -> tuple[Any, list[tuple[int, staged.Traced]]]:
    """to_jax, with every branch trace recorded as (number of user operands, the traced graph)."""
    seen: list[tuple[int, staged.Traced]] = []
    real = staged.trace

    def spy(fn, operands, site):
        out = real(fn, operands, site)
        seen.append((operands.n_user, out))
        return out

    staged.trace = spy
    try:
        return dycl_jax.to_jax(model, args, host="staged"), seen
    finally:
        staged.trace = real


def _assert_lazy_state(seen: list[tuple[int, staged.Traced]], n_state: int) -> None:
    assert seen, "no branch was traced"
    lifted = 0
    for n_user, t in seen:
        placeholders = [n for n in t.gm.graph.nodes if n.op == "placeholder"]
        assert len(placeholders) == len(t.inputs)
        state = [p for i, p in zip(t.inputs, placeholders) if i >= n_user]
        # a graph input for state the branch never reads is the cost this avoids
        assert all(p.users for p in state), [p.name for p in state if not p.users]
        lifted += len(state)
    assert 0 < lifted < n_state * len(seen)


def _compare(model: nn.Module, jm: Any, cases: list[tuple]) -> dict[str, set]:
    seen: dict[str, set] = defaultdict(set)
    paths = set()
    for k, args in enumerate(cases):
        with torch.no_grad():
            original = model(*args)
        got, decisions = jm.trace(*args)
        assert_same(original, got, f"input {k} (jm.trace vs original torch)")
        assert_same(original, jm(*args), f"input {k} (jm(...) vs original torch)")
        _, torch_decisions = run_torch_trace(model, "forward", args)
        assert decisions == torch_decisions, f"input {k}: decisions differ"
        paths.add(tuple(decisions))
        for site, value in decisions:
            seen[site].add(value)
    assert len(paths) >= 2, "every input took the same path"
    return seen


def test_nested_branches_and_loops_read_only_their_state():
    model = _Nested().eval()
    jm, seen = _convert_watching(model, (torch.randn(2, 4),))
    _assert_lazy_state(seen, len(list(model.parameters())) + 2)
    g = torch.Generator().manual_seed(0)
    cases = [(s * torch.randn(2, 4, generator=g) + b,) for s in (0.1, 1.0, 3.0) for b in (-1.0, 0.0, 1.0)]
    decided = _compare(model, jm, cases)
    assert len(decided) == 3 and all(v == {True, False} for v in decided.values()), decided


def test_report_times_each_stage():
    jm, _ = _convert_watching(_Nested().eval(), (torch.randn(2, 4),))
    timings = jm.report().timings
    stages = ("rewrite_s", "export_s", "decompose_s", "lower_s", "check_s")
    assert all(timings[k] > 0 for k in stages), timings
    assert timings["export_s"] + timings["decompose_s"] <= timings["capture_s"]
    text = render_report(jm.report())
    assert "torch.export" in text and "decomposition to core ATen" in text and "rewrite" in text


@pytest.fixture(scope="module")
def blockdrop():
    # the ResNet-110 code with 9 gated blocks: blocks 1-4 of the first segment are one run (a scan)
    model, args = blockdrop110.example((5, 2, 2))
    jm, seen = _convert_watching(model, args)
    return model, jm, seen


def test_blockdrop110_branches_read_only_their_block(blockdrop):
    model, _, seen = blockdrop
    n_state = len(list(model.parameters())) + len(list(model.buffers()))
    _assert_lazy_state(seen, n_state)
    # a running block reads its own two convolutions and batch norms (12 tensors), nothing else
    assert max(len(t.inputs) - n for n, t in seen) <= 12


def test_blockdrop110_matches_torch_on_different_paths(blockdrop):
    model, jm, _ = blockdrop
    decided = _compare(model, jm, blockdrop110.inputs(8))
    assert any(v == {True, False} for v in decided.values()), decided


def test_blockdrop110_run_of_equal_blocks_is_one_scan_over_its_stacked_state(blockdrop):
    from flax import nnx

    from dycl_jax.runtime.state import to_state_dict

    model, jm, _ = blockdrop
    paths = jm.state_paths
    assert "rnet.blocks.0.1-4.conv1.weight" in paths and "rnet.blocks.0.0.conv1.weight" in paths
    # (only the BatchNorm counters no graph reads stay per block)
    assert not any(p.startswith(("rnet.blocks.0.1.", "rnet.blocks.0.4.")) and "num_batches" not in p for p in paths)
    values = dict(zip(paths, jm._state_values()))
    assert values["rnet.blocks.0.1-4.conv1.weight"].shape == (4, 16, 16, 3, 3)
    # each role is held once: the JAX state is no larger than the torch state it came from
    torch_bytes = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    assert sum(v.nbytes for v in values.values()) <= torch_bytes
    # the stacked rows go back to their own blocks' torch paths, exactly
    back = to_state_dict(nnx.state(jm.module), model.state_dict())
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(jm._emitted().state[k], model.state_dict()[k]) for k in jm._emit_input.state)
    jaxpr = str(jax.make_jaxpr(jm._fn)(jm._state_values(), jm.signature.bind(blockdrop110.inputs(1)[0])))
    assert jaxpr.count(" scan[") == 1 and jaxpr.count(" cond[") == 9 - 4 + 1, jaxpr.count(" cond[")
    x = blockdrop110.inputs(3, seed=5)[2]
    with torch.no_grad():
        original = model(*x)
    got = jax.jit(jm.apply)(nnx.state(jm.module), *(jax.numpy.asarray(t.numpy()) for t in x))
    assert_same(original, got, "apply (jitted) vs original torch")


def test_blockdrop110_gradients_through_the_scan_match_torch_autograd(blockdrop):
    """d(sum of the logits)/d(parameters) by jax.grad(jm.apply), through the scan over the
    stacked run and the conds of the other gated blocks, mapped back to the torch parameters'
    own names (to_state_dict), equals torch autograd within 1e-4, on inputs that run and skip
    blocks."""
    import numpy as np
    from flax import nnx

    from dycl_jax.runtime.state import to_state_dict

    model, jm, _ = blockdrop
    params, rest = nnx.state(jm.module).split(nnx.Param, ...)
    loss = lambda p, *a: jax.numpy.sum(jm.apply(nnx.merge_state(p, rest), *a)[0])  # noqa: E731
    grad = jax.jit(jax.grad(loss))
    cases = blockdrop110.inputs(4, seed=2)
    policies = set()
    for k, x in enumerate(cases):
        model.zero_grad()
        out = model(*x)
        policies.add(tuple(out[1].flatten().tolist()))
        out[0].sum().backward()
        got = to_state_dict(grad(params, *(jax.numpy.asarray(t.numpy()) for t in x)))
        reached = 0
        for name, p in model.named_parameters():
            want = p.grad.numpy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
            have = got[name].numpy() if name in got else np.zeros_like(want)  # a parameter no graph reads
            scale = max(1.0, float(np.abs(want).max()))
            np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-4 * scale, err_msg=f"case {k}: {name}")
            reached += bool(np.abs(want).max() > 0)
        assert reached > 10, reached
    assert len(policies) >= 2, policies  # different blocks ran


class _Dilated(nn.Module):
    """One block class; dilation and slope are Python attributes its forward reads (graph constants)."""

    def __init__(self, dilation: int, slope: float) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 3, padding=dilation, dilation=dilation)
        self.slope = slope

    def forward(self, x):
        return F.leaky_relu(self.conv(x), self.slope)


class _LookAlike(nn.Module):
    """Eleven gated blocks of one class and shapes: blocks 5 (dilation 2) and 6 (slope 0.2) differ
    from the others only in a constant, so only blocks 1-4 and 7-10 may run as scans (block 0's
    stretch of the graph also holds the gate)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(11)
        spec = [(1, 0.1)] * 5 + [(2, 0.1), (1, 0.2)] + [(1, 0.1)] * 4
        self.blocks = nn.ModuleList(_Dilated(d, s) for d, s in spec)
        self.gate = nn.Linear(32, 11)

    def forward(self, x):
        flags = list((self.gate(x.flatten(1)) > 0).unbind(1))  # a Python list of tensors
        for i, block in enumerate(self.blocks):
            if flags[i].sum() == 0:
                continue
            x = x + block(x)
        return x


def test_blocks_that_differ_in_a_constant_are_not_one_scan():
    model = _LookAlike().eval()
    jm = dycl_jax.to_jax(model, (torch.randn(1, 4, 8),), host="staged")
    stacked = sorted({p.rsplit(".", 2)[0] for p in jm.state_paths if "-" in p})
    assert stacked == ["blocks.1-4", "blocks.7-10"], jm.state_paths
    assert {"blocks.0.conv.weight", "blocks.5.conv.weight", "blocks.6.conv.weight"} <= set(jm.state_paths)
    g = torch.Generator().manual_seed(4)
    cases = [(s * torch.randn(1, 4, 8, generator=g),) for s in (0.5, 1.0, 2.0) for _ in range(3)]
    decided = _compare(model, jm, cases)
    assert decided and all(v == {True, False} for v in decided.values()), decided


def test_converted_model_keeps_no_torch_parameters():
    # the JaxModel holds JAX copies only: dropping the torch model frees its parameters
    import gc
    import weakref

    model, args = load("skipnet_ff").example()
    refs = [weakref.ref(t) for t in (*model.parameters(), *model.buffers())]
    jm = dycl_jax.to_jax(model, args)
    del model
    gc.collect()
    assert refs and sum(r() is not None for r in refs) == 0
    assert "class " in jm.to_source()  # emission still has what it needs (weights from the JAX state)


class _Gated(nn.Module):
    """Four gated blocks of one structure (BlockDrop's shape in small): torch's branch checks
    run once for all of them, and each block still computes with its own weights."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)) for _ in range(4))
        self.gate = nn.Linear(8, 4)

    def forward(self, x):
        policy = (self.gate(x) > 0).float()
        for t, block in enumerate(self.blocks):
            keep = policy[:, t:t + 1]
            if keep.sum() == 0:
                continue
            x = x + block(x) * keep
        return x


def test_structurally_equal_branches_share_torchs_checks():
    from torch._higher_order_ops.cond import CondOp

    from dycl_jax.capture import branch_checks

    real, computed = CondOp.gen_schema, []

    def counted(self, *args):
        computed.append(tuple(isinstance(f, torch.fx.GraphModule) for f in args[1:3]))
        return real(self, *args)

    CondOp.gen_schema = counted
    try:
        model = _Gated().eval()
        jm = dycl_jax.to_jax(model, (torch.randn(1, 8),), host="staged")
    finally:
        CondOp.gen_schema = real
    assert CondOp.gen_schema is real and branch_checks.hop_utils._check_alias_and_mutation.__name__ == "_check_alias_and_mutation"
    # decomposition sees the branches as graphs: the four conds' schema is computed once
    graphs = [c for c in computed if c == (True, True)]
    assert len(graphs) == 1, computed
    g = torch.Generator().manual_seed(1)
    decided = _compare(model, jm, [(s * torch.randn(1, 8, generator=g),) for s in (0.3, 1.0, 3.0) for _ in range(4)])
    assert list(decided.values()) == [{True, False}], decided  # one site, taken both ways


def test_a_failing_branch_check_is_not_remembered():
    from torch.fx.experimental.proxy_tensor import make_fx

    from dycl_jax.capture.branch_checks import hop_utils, shared_branch_checks

    gm = make_fx(lambda x: x.add_(1))(torch.zeros(3))
    with shared_branch_checks() as memo:
        for _ in range(2):  # torch's refusal each time, nothing kept
            with pytest.raises(RuntimeError, match="cond_true might be"):
                hop_utils._check_alias_and_mutation(gm, [torch.zeros(3)], "cond_true", False)
        assert not memo
        clean = make_fx(lambda x: x + 1)(torch.zeros(3))
        hop_utils._check_alias_and_mutation(clean, [torch.zeros(3)], "cond_true", False)
        assert len(memo) == 1


class _Scaled(nn.Module):
    """One block class; `scale` is a Python attribute its forward reads (a constant in the graph)."""

    def __init__(self, width: int, scale: float) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.scale = scale

    def forward(self, x):
        return torch.relu(self.lin(x)) * self.scale


class _Mixed(nn.Module):
    """Gated blocks of one code: two equal, one differing only in a Python attribute, one at
    another width. Only the equal two may share a trace; all keep their own weights."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.blocks = nn.ModuleList([_Scaled(8, 2.0), _Scaled(8, 2.0), _Scaled(8, 3.0)])
        self.down = nn.Linear(8, 6)
        self.narrow = _Scaled(6, 2.0)
        self.gate = nn.Linear(8, 4)

    def forward(self, x):
        flags = [g for g in (self.gate(x) > 0).float().unbind(1)]  # a Python list of tensors
        for t, block in enumerate(self.blocks):
            if flags[t].sum() == 0:
                continue
            x = x + block(x) * flags[t].view(-1, 1)
        x = self.down(x)
        keep = flags[3]
        if keep.sum() > 0:
            x = x + self.narrow(x)
        return x


def _capture_text(jm: Any) -> list[str]:
    """Every graph of the captured program with each node's module path and stack trace."""
    ep = jm._emit_input.ep
    out = []
    for name, gm in ep.graph_module.named_modules():
        if isinstance(gm, torch.fx.GraphModule):
            out.append(name + gm.code)
            out += [f"{n.name} {n.meta.get('nn_module_stack')} {n.meta.get('stack_trace')}" for n in gm.graph.nodes]
    return out


def test_equal_blocks_share_traces_and_others_do_not():
    import contextlib

    from dycl_jax.capture import branch_traces, shims

    model = _Mixed().eval()
    memos: list[dict] = []
    real = shims.shared_branch_traces

    @contextlib.contextmanager
    def counted():
        with real() as memo:
            memos.append(memo)
            yield memo

    shims.shared_branch_traces = counted
    try:
        jm = dycl_jax.to_jax(model, (torch.randn(2, 8),), host="staged")
        shims.shared_branch_traces = contextlib.nullcontext  # torch's own tracing, for reference
        plain = dycl_jax.to_jax(model, (torch.randn(2, 8),), host="staged")
    finally:
        shims.shared_branch_traces = real
    assert branch_traces.cond_module.reenter_make_fx is branch_traces.hop_utils.reenter_make_fx
    assert memos and memos[0]["hits"] > 0, memos  # blocks 0 and 1 share their traces
    # the shared copies carry each block's own module paths: the captured program is torch's
    assert _capture_text(jm) == _capture_text(plain)
    assert jm.to_source() == plain.to_source()
    g = torch.Generator().manual_seed(2)
    cases = [(s * torch.randn(2, 8, generator=g),) for s in (0.2, 1.0, 4.0) for _ in range(4)]
    decided = _compare(model, jm, cases)
    assert len(decided) == 2 and all(v == {True, False} for v in decided.values()), decided  # the loop, the last if



def test_placeholder_metadata_copied_as_torch_copies_it():
    import copy
    from types import SimpleNamespace

    from torch._export.utils import _populate_param_buffer_metadata_to_new_gm as torchs

    from dycl_jax.capture.shims import _param_buffer_metadata

    gm = torch.fx.symbolic_trace(lambda w, b, x, s: x * w + b + s)
    # w, b: parameters; s: a buffer; x: a user input (no metadata)
    sig = SimpleNamespace(inputs_to_parameters={"w": "lin.weight", "b": "lin.bias"}, inputs_to_buffers={"s": "shift"})
    recorded = {t: {"marker": t, "nn_module_stack": {}, "stack_trace": "x"} for t in ("lin.weight", "lin.bias", "shift")}
    metas = []
    for fn in (torchs, _param_buffer_metadata):
        copied = copy.deepcopy(gm)
        fn(copy.deepcopy(recorded), copied, sig)
        metas.append({n.name: dict(n.meta) for n in copied.graph.nodes})
    assert metas[0] == metas[1]
    assert {n: m.get("marker") for n, m in metas[1].items() if m} == {"w": "lin.weight", "b": "lin.bias", "s": "shift"}


def test_decomposition_table_is_built_once_and_follows_new_custom_ops():
    """Every capture decomposes with one table, built once rather than per capture, still the
    default one (less detach and linspace, plus the unchecked linalg ops), a copy each time, and
    rebuilt when an operator is registered (a custom op's own decomposition is in it)."""
    from dycl_jax.capture import export
    from dycl_jax.capture.checked_linalg import UNCHECKED

    want = dict(torch.export.default_decompositions())
    for op in (torch.ops.aten.detach.default, torch.ops.aten.linspace.default):
        want.pop(op)
    want.update(UNCHECKED)

    def same(table: dict) -> bool:  # torch makes a new partial per CIA op and table: compare what it calls
        def what(f):
            return (f.func.__qualname__, f.args, f.keywords) if isinstance(f, functools.partial) else f
        return table.keys() == want.keys() and all(what(table[k]) == what(want[k]) for k in want)

    first = export._core_aten_table()
    assert same(first)
    first.clear()  # run_decompositions deletes entries from the table it is given
    assert same(export._core_aten_table())
    hits = export._core_aten_table_for.cache_info().hits
    export._core_aten_table()
    assert export._core_aten_table_for.cache_info().hits == hits + 1
    lib = torch.library.Library("dycl_decomp_test", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
    assert torch.ops.dycl_decomp_test.twice.default in export._core_aten_table()


def test_conversion_pauses_the_collector_and_restores_its_state():
    import gc

    model = nn.Linear(4, 4).eval()  # what is tested is to_jax's wrapper: the smallest model does
    during: list[bool] = []
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            dycl_jax.to_jax(model, (torch.randn(2, 4),), host="staged", progress=lambda _: during.append(gc.isenabled()))
            assert gc.isenabled() is enabled  # the user's choice, as before the conversion
        gc.enable()
        with pytest.raises(dycl_jax.DyclError):
            dycl_jax.to_jax(model, (torch.randn(2, 4),), method="absent")
        assert gc.isenabled()  # restored on a refusal too
    finally:
        (gc.enable if was else gc.disable)()
    assert during and not any(during), during  # no full collection rescans the conversion's objects


def test_stack_traces_read_only_the_lines_of_the_frames_they_keep():
    import linecache
    import re

    model = _Mixed().eval()
    reads = [0]
    real_getline = linecache.getline

    def counted(*a: Any, **k: Any) -> str:
        reads[0] += 1
        return real_getline(*a, **k)

    linecache.getline = counted
    try:
        jm = dycl_jax.to_jax(model, (torch.randn(2, 8),), host="staged")
    finally:
        linecache.getline = real_getline
    ep = jm._emit_input.ep
    nodes = [n for gm in ep.graph_module.modules() if isinstance(gm, torch.fx.GraphModule) for n in gm.graph.nodes]
    frames = re.compile(r'File "(.+)", line (\d+), in .+\n    (.*)')
    shown = [m.groups() for n in nodes for m in frames.finditer(n.meta.get("stack_trace") or "")]
    # every node's trace still shows the user's frames with their source lines, as torch writes them
    assert any(f.startswith("<dycl-rewrite:_Mixed") and "block(x)" in line for f, _, line in shown), shown[:5]
    assert all(real_getline(f, int(k)).strip() == line for f, k, line in shown)
    # torch's extraction reads the line of every frame of the stack (some 80 per recorded node)
    assert reads[0] < 12 * len(nodes), (reads[0], len(nodes))


def test_node_stacks_read_from_python_frames_are_torchs():
    """fx's per-node stack traces, read from the Python frames (shims._PythonStack), are the
    ones torch's symbolized tracebacks give: the captured program is the same, node for node
    (export's tracer keeps only `forward` frames); and for a plain fx tracer, which keeps every
    frame from the first `forward` on."""
    import contextlib

    from dycl_jax.capture import shims

    model = _Mixed().eval()
    x = torch.randn(2, 8)
    calls = [0]
    real_summary, real_stacks = shims._PythonStack.summary, shims._python_stacks

    def counted(self: Any) -> Any:
        calls[0] += 1
        return real_summary(self)

    shims._PythonStack.summary = counted
    try:
        jm = dycl_jax.to_jax(model, (x,), host="staged")
        assert calls[0] > 0  # fx read its stacks here
        shims._python_stacks = contextlib.nullcontext  # torch's own, for reference
        plain = dycl_jax.to_jax(model, (x,), host="staged")
    finally:
        shims._PythonStack.summary, shims._python_stacks = real_summary, real_stacks
    ours, torchs = _capture_text(jm), _capture_text(plain)
    assert any("block(x)" in line for line in ours)  # user frames with their source lines
    assert ours == torchs
    assert_same(model(x), jm(x), "jm(...) vs original torch")

    class Plain(nn.Module):  # no control flow: fx's symbolic tracer takes it
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return torch.relu(self.lin(x)) * 2

    def fx_stacks() -> list[str | None]:
        tracer = torch.fx.Tracer()
        tracer.record_stack_traces = True
        return [n.stack_trace for n in tracer.trace(Plain()).nodes]

    with shims._python_stacks():
        ours = fx_stacks()
    assert any(s and "torch.relu(self.lin(x))" in s for s in ours) and ours == fx_stacks()


def test_module_tree_walked_once_per_tracer_as_torch_walks_it():
    import contextlib

    from dycl_jax.capture import shims

    tree = nn.Module()  # a layer under two paths, a None child, nesting
    tree.body = _Mixed()
    tree.pre = nn.Linear(8, 8)
    tree.again = tree.pre
    tree.register_module("absent", None)
    walked = shims._all_module_paths(tree)
    assert walked == list(tree.named_modules(remove_duplicate=False))
    assert walked[1:3] == [("body", tree.body), ("body.blocks", tree.body.blocks)]
    assert [p for p, m in walked if m is tree.pre] == ["pre", "again"]

    class Own(nn.Module):
        def named_modules(self, *a: Any, **k: Any) -> Any:  # a walk of its own: torch's is used
            return super().named_modules(*a, **k)

    assert shims._all_module_paths(nn.Sequential(Own())) is None
    model = _Mixed().eval()
    x = torch.randn(2, 8)
    walks = [0]
    real_walk, real_shim = shims._all_module_paths, shims._module_paths_walked_once

    def counted(root: Any) -> Any:
        walks[0] += 1
        return real_walk(root)

    shims._all_module_paths = counted
    try:
        jm = dycl_jax.to_jax(model, (x,), host="staged")
        assert walks[0] > 1  # one per tracer: export's and each branch's
        shims._module_paths_walked_once = contextlib.nullcontext  # torch's own, for reference
        plain = dycl_jax.to_jax(model, (x,), host="staged")
    finally:
        shims._all_module_paths, shims._module_paths_walked_once = real_walk, real_shim
    assert _capture_text(jm) == _capture_text(plain)
    assert jm.to_source() == plain.to_source()
    assert_same(model(x), jm(x), "jm(...) vs original torch")
