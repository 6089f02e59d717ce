"""Runs PyTorch OpInfo samples through `to_jax` and compares with eager torch (shared by test and script)."""
from __future__ import annotations

import contextlib
import io
import itertools
import time
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree

import dycl_jax
from dycl_jax.errors import CaptureError, DyclError, InputMutationError
from opinfo_compare import compare, identical, outside_int32

SAMPLES_PER_ENTRY = 4  # the first samples of an entry cover its common call forms; more mostly repeat them

# Sample outcomes. "not exportable": torch itself cannot run or export the sample. "not
# comparable": the sample cannot be judged against eager torch by design: its output is
# random (dropout_p > 0) or it updates its inputs in place (training-mode running stats),
# which dycl_jax refuses with a CaptureError because converted models are pure functions.
PASS, FAIL, NOT_EXPORTABLE, NOT_COMPARABLE = "pass", "fail", "not exportable", "not comparable"

_OP_DB: dict[tuple[str, str], Any] | None = None


def op_db() -> dict[tuple[str, str], Any]:
    """OpInfo entries by (name, variant_test_name); importing the database takes a few seconds."""
    global _OP_DB
    if _OP_DB is None:
        from torch.testing._internal.common_methods_invocations import op_db as db

        _OP_DB = {(o.name, o.variant_test_name): o for o in db}
    return _OP_DB


def entry_id(key: tuple[str, str]) -> str:
    return f"{key[0]}.{key[1]}" if key[1] else key[0]


@dataclass
class SampleResult:
    status: str
    detail: str = ""


@dataclass
class EntryResult:
    key: tuple[str, str]
    samples: list[SampleResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def status(self) -> str:
        """fail if any sample fails; pass if at least one ran and passed; else why none ran."""
        kinds = {s.status for s in self.samples}
        for status in (FAIL, PASS, NOT_EXPORTABLE):
            if status in kinds:
                return status
        return NOT_COMPARABLE

    def failures(self) -> list[str]:
        return [f"sample {i}: {s.detail}" for i, s in enumerate(self.samples) if s.status == FAIL]


class OpModule(torch.nn.Module):
    """forward(*tensor leaves) = op(input, *args, **kwargs), with the sample's non-tensors baked in."""

    def __init__(self, op: Any, leaves: list[Any], spec: pytree.TreeSpec):
        super().__init__()
        self.op = op
        self.leaves = leaves
        self.spec = spec
        self.tensor_index = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]

    def forward(self, *tensors: torch.Tensor) -> Any:
        leaves = list(self.leaves)
        for i, t in zip(self.tensor_index, tensors):
            leaves[i] = t
        inp, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.op(inp, *args, **kwargs)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


@dataclass
class _Prepared:
    """One sample ready to convert: its module, tensor inputs and torch's eager result."""

    module: OpModule
    tensors: list[torch.Tensor]
    expected: Any
    too_wide: bool  # carries integers outside int32: a DyclError is an acceptable outcome


class _Batch(torch.nn.Module):
    """Several samples of one entry in one graph, so one export and one jit cover them all."""

    def __init__(self, parts: list[_Prepared]):
        super().__init__()
        self.parts = torch.nn.ModuleList(p.module for p in parts)
        self.counts = [len(p.tensors) for p in parts]

    def forward(self, *tensors: torch.Tensor) -> tuple[Any, ...]:
        outs, pos = [], 0
        for part, n in zip(self.parts, self.counts):
            outs.append(part(*tensors[pos:pos + n]))
            pos += n
        return tuple(outs)


def _eager(module: OpModule, tensors: list[torch.Tensor], seed: int) -> Any:
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return module(*[t.clone() for t in tensors])  # clones: in-place ops must not alter the sample


def _prepare(op: Any, sample: Any) -> _Prepared | SampleResult:
    leaves, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    module = OpModule(op, leaves, spec).eval()
    tensors = [leaves[i] for i in module.tensor_index]
    try:
        expected = _eager(module, tensors, seed=0)
        again = _eager(module, tensors, seed=1)
    except Exception as exc:
        return SampleResult(NOT_EXPORTABLE, f"torch eager fails: {_first_line(exc)}")
    if not identical(expected, again):
        return SampleResult(NOT_COMPARABLE, "random output: two torch runs with different seeds differ")
    return _Prepared(module, tensors, expected, outside_int32(leaves))


@dataclass
class _TorchVerdict:
    """What plain torch.export (no dycl_jax involved) makes of a sample."""

    error: str | None = None  # torch's own refusal
    mutates: bool = False  # the graph updates user inputs in place
    random_ops: tuple[str, ...] = ()  # seeded random ops: their values cannot match torch's


def _torch_export_verdict(module: OpModule, tensors: list[torch.Tensor]) -> _TorchVerdict:
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            ep = torch.export.export(module, tuple(tensors)).run_decompositions()
    except Exception as exc:
        return _TorchVerdict(error=_first_line(exc))
    random_ops = {
        str(n.target) for n in ep.graph.nodes
        if isinstance(n.target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in n.target.tags
    }
    return _TorchVerdict(None, bool(ep.graph_signature.user_inputs_to_mutate), tuple(sorted(random_ops)))


def _excused(p: _Prepared, problem: str, is_capture: bool, mutation: bool = False) -> SampleResult:
    """The result of a sample dycl_jax did not convert or match, unless torch explains why."""
    verdict = _torch_export_verdict(p.module, p.tensors)
    # Only torch's own refusal to capture counts as "not exportable"; once dycl_jax has
    # captured the sample, every later problem is dycl_jax's.
    if is_capture and verdict.error is not None:
        return SampleResult(NOT_EXPORTABLE, verdict.error)
    if verdict.random_ops:
        # OpInfo reseeds torch before such ops; no JAX program can reproduce torch's RNG stream
        return SampleResult(NOT_COMPARABLE, f"random op {', '.join(verdict.random_ops)}: {problem}")
    if mutation and verdict.mutates:
        return SampleResult(NOT_COMPARABLE, f"updates its inputs in place, refused by design: {problem}")
    if is_capture:
        problem = f"dycl_jax capture failed where torch.export works: {problem}"
    return SampleResult(FAIL, problem)


def _convert_and_call(module: torch.nn.Module, tensors: list[torch.Tensor]) -> Any:
    # torch.export prints its partial graph to stderr when it fails; the result says enough
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        jm = dycl_jax.to_jax(module, tuple(tensors), dynamic_batch=False)
    return jm(*tensors)


def _run_one(p: _Prepared) -> SampleResult:
    """Convert one sample with to_jax, call it, compare with eager torch."""
    try:
        got = _convert_and_call(p.module, p.tensors)
    except DyclError as exc:
        if p.too_wide:
            return SampleResult(PASS, "raised DyclError for a value outside int32")
        return _excused(p, _first_line(exc), isinstance(exc, CaptureError), isinstance(exc, InputMutationError))
    except Exception as exc:  # anything else escaping dycl_jax is a bug, never "not exportable"
        return SampleResult(FAIL, f"unexpected {_first_line(exc)}")
    diff = compare(p.expected, got)
    return _excused(p, diff, False) if diff else SampleResult(PASS)


def _run_batched(parts: list[_Prepared]) -> list[SampleResult] | None:
    """Results of all `parts` from one conversion, or None when that conversion fails."""
    try:
        got = _convert_and_call(_Batch(parts), [t for p in parts for t in p.tensors])
    except Exception:  # the per-sample runs that follow say which sample fails and why
        return None
    results = []
    for p, g in zip(parts, got):
        diff = compare(p.expected, g)
        results.append(_excused(p, diff, False) if diff else SampleResult(PASS))
    return results


def run_samples(op: Any, samples: list[Any]) -> list[SampleResult]:
    """Results per sample. Samples are first converted together, as one export costs ~0.3 s;
    if that conversion fails, each sample is converted on its own to isolate the failure."""
    prepared = [_prepare(op, s) for s in samples]
    results: list[SampleResult | None] = [p if isinstance(p, SampleResult) else None for p in prepared]
    plain = [i for i, p in enumerate(prepared) if isinstance(p, _Prepared) and not p.too_wide]
    batched = _run_batched([prepared[i] for i in plain]) if len(plain) > 1 else None
    if batched is not None:
        for i, r in zip(plain, batched):
            results[i] = r
    for i, p in enumerate(prepared):
        if results[i] is None:
            results[i] = _run_one(p)
    return results


def samples_of(key: tuple[str, str], limit: int = SAMPLES_PER_ENTRY) -> list[Any]:
    """The first `limit` float32 samples of an entry, generated from a seed fixed per entry."""
    opinfo = op_db()[key]
    torch.manual_seed(zlib.crc32(entry_id(key).encode()))
    return list(itertools.islice(opinfo.sample_inputs("cpu", torch.float32, requires_grad=False), limit))


def run_entry(key: tuple[str, str], limit: int = SAMPLES_PER_ENTRY) -> EntryResult:
    start = time.perf_counter()
    opinfo = op_db()[key]
    result = EntryResult(key)
    try:
        samples = samples_of(key, limit)
    except Exception as exc:
        result.samples.append(SampleResult(NOT_EXPORTABLE, f"OpInfo sample generation fails: {_first_line(exc)}"))
        samples = []
    result.samples.extend(run_samples(opinfo.op, samples))
    result.seconds = time.perf_counter() - start
    return result
