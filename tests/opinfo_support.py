"""Runs PyTorch OpInfo samples through `to_jax` in every supported dtype and compares with eager
torch (shared by the test and scripts/op_coverage.py)."""
from __future__ import annotations

import contextlib
import io
import time
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Collection

import torch
import torch.utils._pytree as pytree

import dycl_jax
from dycl_jax.capture.export import _dynamic_shapes
from dycl_jax.errors import CaptureError, DyclError, InputMutationError
from opinfo_compare import (
    SIGN_FREE, TIE_ORDER_FREE, WIDER, align_signs, compare, compare_tie_free, identical, no_less_accurate, outside_int32,
)

# The dtypes ordinary models compute in; an entry runs in each one its OpInfo supports on CPU.
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool)
BATCH = 48  # samples per converted graph: one export and one jit for many samples, small enough to compile fast

# Sample outcomes. "not exportable": torch itself cannot run or export the sample. "not
# comparable": the sample cannot be judged against eager torch by design: its output is
# random (dropout_p > 0) or it updates its inputs in place (training-mode running stats),
# which dycl_jax refuses with a CaptureError because converted models are pure functions.
# Everything else dycl_jax raises or gets wrong is "fail".
PASS, FAIL, NOT_EXPORTABLE, NOT_COMPARABLE = "pass", "fail", "not exportable", "not comparable"

_OP_DB: dict[tuple[str, str], Any] | None = None


def op_db() -> dict[tuple[str, str], Any]:
    """OpInfo entries by (name, variant_test_name); importing the database takes a few seconds,
    once per process."""
    global _OP_DB
    if _OP_DB is None:
        from torch.testing._internal.common_methods_invocations import op_db as db

        _OP_DB = {(o.name, o.variant_test_name): o for o in db}
    return _OP_DB


def entry_id(key: tuple[str, str]) -> str:
    return f"{key[0]}.{key[1]}" if key[1] else key[0]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtypes_of(key: tuple[str, str]) -> list[torch.dtype]:
    """The dtypes of DTYPES the entry's OpInfo supports on CPU."""
    opinfo = op_db()[key]
    return [d for d in DTYPES if opinfo.supports_dtype(d, "cpu")]


@dataclass
class SampleResult:
    status: str
    detail: str = ""
    dtype: str = ""  # the OpInfo dtype the sample was generated in
    index: int = 0  # its position among the entry's samples of that dtype (as samples_of numbers them)


@dataclass
class EntryResult:
    key: tuple[str, str]
    samples: list[SampleResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def dtypes(self) -> list[str]:
        return list(dict.fromkeys(s.dtype for s in self.samples))

    def status_of(self, dtype: str | None = None) -> str:
        """fail if any sample (of `dtype`, or of any dtype) fails; pass if at least one ran and
        passed; else why none ran."""
        kinds = {s.status for s in self.samples if dtype is None or s.dtype == dtype}
        for status in (FAIL, PASS, NOT_EXPORTABLE):
            if status in kinds:
                return status
        return NOT_COMPARABLE

    @property
    def status(self) -> str:
        return self.status_of(None)

    def failures(self, dtype: str | None = None) -> list[str]:
        return [
            f"{s.dtype} sample {s.index}: {s.detail}" for s in self.samples
            if s.status == FAIL and (dtype is None or s.dtype == dtype)
        ]


class OpModule(torch.nn.Module):
    """forward(*tensor leaves) = op(input, *args, **kwargs), with the sample's non-tensors baked in."""

    def __init__(self, op: Any, leaves: list[Any], spec: pytree.TreeSpec):
        super().__init__()
        self.op = op
        self.leaves = leaves
        self.spec = spec
        self.tensor_index = [i for i, v in enumerate(leaves) if isinstance(v, torch.Tensor)]

    def forward(self, *tensors: torch.Tensor) -> Any:
        # two statements: where the op needs the dispatch host (split points from tensor data),
        # it captures few regions (one export each) before the op runs on the host
        inp, args, kwargs = self.arguments(tensors)
        return self.op(inp, *args, **kwargs)  # the dispatch host names this line if the op ran in torch

    def arguments(self, tensors: tuple[torch.Tensor, ...]) -> Any:
        """(input, args, kwargs) of the sample, with `tensors` in place of its tensors."""
        leaves = list(self.leaves)
        for i, t in zip(self.tensor_index, tensors):
            leaves[i] = t
        return pytree.tree_unflatten(leaves, self.spec)


_OP_CALL = "self.op(inp, *args, **kwargs)"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


@dataclass
class _Prepared:
    """One sample ready to convert: its module, tensor inputs and torch's eager result."""

    module: OpModule
    tensors: list[torch.Tensor]
    expected: Any
    dtype: str
    too_wide: bool  # carries int64 values outside int32: converted on its own (it needs 64-bit JAX)
    name: str  # the OpInfo entry's name
    sample: Any

    def check(self, got: Any) -> str | None:
        """None when `got` matches torch's result; else what differs."""
        if self.name in TIE_ORDER_FREE:
            s = self.sample
            return compare_tie_free(self.name, s.input, tuple(s.args), dict(s.kwargs), self.expected, got)
        if self.name in SIGN_FREE:
            got = align_signs(self.name, self.expected, got)
        diff = compare(self.expected, got)
        if diff and "values differ" in diff and any(t.dtype in WIDER for t in self.tensors):
            # beyond the tolerance of torch's result: still right if no less accurate than it
            wide = [t.to(WIDER[t.dtype]) if t.dtype in WIDER else t for t in self.tensors]
            try:
                reference = _eager(self.module, wide, seed=0)
            except Exception:  # the op has no wider form with these arguments
                return diff
            return None if no_less_accurate(self.expected, reference, got) is None else diff
        return diff

    def group(self) -> tuple[bool, int | None]:
        """Samples with the same group convert together with the dims to_jax would make dynamic
        for each of them alone: the batch dim marks every tensor whose first dim equals the first
        tensor's (capture/export.py), so a batch holds samples of one first-tensor batch size."""
        spec = _dynamic_shapes(self.tensors, True)
        return self.too_wide, (self.tensors[0].shape[0] if spec else None)


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


def _prepare(name: str, op: Any, sample: Any, dtype: str) -> _Prepared | SampleResult:
    leaves, spec = pytree.tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    module = OpModule(op, leaves, spec).eval()
    tensors = [leaves[i] for i in module.tensor_index]
    try:
        expected = _eager(module, tensors, seed=0)
        again = _eager(module, tensors, seed=1)
    except Exception as exc:
        return SampleResult(NOT_EXPORTABLE, f"torch eager fails: {_first_line(exc)}", dtype)
    if not identical(expected, again):
        return SampleResult(NOT_COMPARABLE, "random output: two torch runs with different seeds differ", dtype)
    return _Prepared(module, tensors, expected, dtype, outside_int32(leaves), name, sample)


@dataclass
class _TorchVerdict:
    """What plain torch.export (no dycl_jax involved) makes of a sample."""

    error: str | None = None  # torch's own refusal
    mutates: bool = False  # the graph updates user inputs in place
    random_ops: tuple[str, ...] = ()  # seeded random ops: their values cannot match torch's


def _torch_export_verdict(module: OpModule, tensors: list[torch.Tensor]) -> _TorchVerdict:
    # the same dynamic dims to_jax asks for: torch refusing those is torch's refusal too
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            ep = torch.export.export(module, tuple(tensors), dynamic_shapes=_dynamic_shapes(tensors, True))
            ep = ep.run_decompositions()
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
        return SampleResult(NOT_EXPORTABLE, verdict.error, p.dtype)
    if verdict.random_ops:
        # OpInfo reseeds torch before such ops; no JAX program can reproduce torch's RNG stream
        return SampleResult(NOT_COMPARABLE, f"random op {', '.join(verdict.random_ops)}: {problem}", p.dtype)
    if mutation and verdict.mutates:
        return SampleResult(NOT_COMPARABLE, f"updates its inputs in place, refused by design: {problem}", p.dtype)
    if is_capture:
        problem = f"dycl_jax capture failed where torch.export works: {problem}"
    return SampleResult(FAIL, problem, p.dtype)


class _RanInTorch(Exception):
    """The dispatch host ran the op itself in torch: the sample says nothing about a lowering."""


def _convert_and_call(module: torch.nn.Module, tensors: list[torch.Tensor], host: str = "auto") -> Any:
    # to_jax as users call it (dynamic batch on). torch.export prints its partial graph to
    # stderr when it fails; the result says enough.
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        jm = dycl_jax.to_jax(module, tuple(tensors), host=host)
        got = jm(*tensors)
    if jm.host == "dispatch":
        in_torch = [s for s in jm.report().torch_statements if _OP_CALL in s]
        if in_torch:
            raise _RanInTorch(in_torch[0])
    return got


def _run_one(p: _Prepared) -> SampleResult:
    """Convert one sample with to_jax, call it, compare with eager torch."""
    try:
        got = _convert_and_call(p.module, p.tensors)
    except DyclError as exc:
        # a crash inside a lowering arrives as a DyclError too ("lowering ... failed"): it is a
        # failure like any other the torch verdict does not explain
        return _excused(p, _first_line(exc), isinstance(exc, CaptureError), isinstance(exc, InputMutationError))
    except _RanInTorch as exc:
        return _excused(p, f"the op ran in torch on the dispatch host: {exc}", True)
    except Exception as exc:  # anything else escaping dycl_jax is a bug, never "not exportable"
        return SampleResult(FAIL, f"unexpected {_first_line(exc)}", p.dtype)
    diff = p.check(got)
    return _excused(p, diff, False) if diff else SampleResult(PASS, "", p.dtype)


def _run_batch(parts: list[_Prepared], failed: bool = False) -> list[SampleResult]:
    """Results of `parts`, converted as one staged graph; where that fails (or is known to:
    `failed`), the batch is split in halves until the failing samples run on their own (as users
    would convert them). Where both halves fail, their samples run on their own at once: a group
    that all needs the dispatch host (tensor_split at tensor indices) costs three failed batch
    exports, not one per level of halving."""
    if len(parts) == 1:
        return [_run_one(parts[0])]
    got = None if failed else _batch_outputs(parts)
    if got is not None:
        return _checked(parts, got)
    half = len(parts) // 2
    first, second = _batch_outputs(parts[:half]), _batch_outputs(parts[half:])
    if first is None and second is None:
        return [_run_one(p) for p in parts]
    return (_run_batch(parts[:half], True) if first is None else _checked(parts[:half], first)) \
        + (_run_batch(parts[half:], True) if second is None else _checked(parts[half:], second))


def _batch_outputs(parts: list[_Prepared]) -> list | None:
    """The outputs of `parts` converted together on the staged host, or None where that fails."""
    if len(parts) == 1:
        return None  # a sample on its own runs as users convert it (_run_one)
    try:
        return _convert_and_call(_Batch(parts), [t for p in parts for t in p.tensors], host="staged")
    except Exception:
        return None


def _checked(parts: list[_Prepared], got: list) -> list[SampleResult]:
    results = []
    for p, g in zip(parts, got):
        diff = p.check(g)
        results.append(_excused(p, diff, False) if diff else SampleResult(PASS, "", p.dtype))
    return results


def run_samples(name: str, op: Any, samples: list[tuple[str, int, Any]]) -> list[SampleResult]:
    """Results per (dtype name, index, sample), in order. Samples of one group are converted
    together, BATCH at a time, as one export costs ~0.3 s."""
    prepared = [_prepare(name, op, s, dtype) for dtype, _, s in samples]
    results: list[SampleResult | None] = [p if isinstance(p, SampleResult) else None for p in prepared]
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(prepared):
        if isinstance(p, _Prepared):
            groups.setdefault(p.group() if p.tensors else (False, None), []).append(i)
    for members in groups.values():
        for start in range(0, len(members), BATCH):
            chunk = members[start:start + BATCH]
            for i, r in zip(chunk, _run_batch([prepared[i] for i in chunk])):
                results[i] = r
    for r, (_, index, _) in zip(results, samples):
        r.index = index  # type: ignore[union-attr]
    return results  # type: ignore[return-value]


Choose = Callable[[str, int], Collection[int]]  # (dtype name, number of samples) -> indices to run


def first(n: int) -> Choose:
    """The first n samples of every dtype."""
    return lambda dtype, count: range(min(n, count))


def samples_of(key: tuple[str, str], dtype: torch.dtype, choose: Choose | None = None) -> list[tuple[int, Any]]:
    """(index, sample) for the samples of an entry in `dtype` that `choose` picks (all if None),
    generated from a seed fixed per entry and dtype, so an index names the same sample every run."""
    opinfo = op_db()[key]
    torch.manual_seed(zlib.crc32(f"{entry_id(key)}/{dtype_name(dtype)}".encode()))
    samples = list(opinfo.sample_inputs("cpu", dtype, requires_grad=False))
    picked = range(len(samples)) if choose is None else sorted(set(choose(dtype_name(dtype), len(samples))))
    return [(i, samples[i]) for i in picked if i < len(samples)]


def run_entry(key: tuple[str, str], dtypes: list[torch.dtype] | None = None, choose: Choose | None = None) -> EntryResult:
    """The samples `choose` picks (all if None) of the entry in each of `dtypes` (default: all
    it supports of DTYPES)."""
    start = time.perf_counter()
    opinfo = op_db()[key]
    result = EntryResult(key)
    todo: list[tuple[str, int, Any]] = []
    for dtype in dtypes if dtypes is not None else dtypes_of(key):
        name = dtype_name(dtype)
        try:
            todo += [(name, i, s) for i, s in samples_of(key, dtype, choose)]
        except Exception as exc:
            result.samples.append(SampleResult(NOT_EXPORTABLE, f"OpInfo sample generation fails: {_first_line(exc)}", name))
    result.samples.extend(run_samples(key[0], opinfo.op, todo))
    result.seconds = time.perf_counter() - start
    return result
