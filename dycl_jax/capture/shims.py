"""Library code that torch.export cannot trace but whose answer never changes the result:
replaced by an equivalent (or given a fake-tensor rule) while a graph is captured."""
from __future__ import annotations

import contextlib
import importlib
import sys
import traceback
from typing import Any, Iterator, NamedTuple

import torch
import torch.fx.proxy as _fx_proxy
import torch.nn.modules.transformer as _transformer
import torch.utils._traceback as _torch_traceback
from torch.distributions import Distribution
from torch.fx._lazy_graph_module import _use_lazy_graph_module
from torch.fx.experimental import proxy_tensor

from dycl_jax.capture.branch_checks import shared_branch_checks
from dycl_jax.capture.branch_traces import shared_branch_traces


def _causal_hint(mask: Any, is_causal: bool | None = None, size: int | None = None) -> bool:
    # torch compares the mask with a causal one (a data-dependent bool) only to pick a fast
    # path; with the hint False the mask itself is applied, which gives the same values
    return is_causal is True


def _ctc_loss_fake(log_probs: Any, targets: Any, input_lengths: Any, target_lengths: Any, blank: int = 0,
                   zero_infinity: bool = False) -> tuple[Any, Any]:
    # torch has no fake rule for ctc_loss, because its second output (log_alpha, read only by
    # the backward) is 2 * max(target_lengths) + 1 wide. The loss itself has a static shape;
    # with tensor lengths log_alpha gets the static bound 2 * targets.shape[-1] + 1.
    batched = log_probs.dim() == 3
    longest = max(target_lengths, default=0) if isinstance(target_lengths, (list, tuple)) else targets.shape[-1]
    width = 2 * longest + 1
    nll = log_probs.new_empty((log_probs.shape[1],) if batched else ())
    alpha = log_probs.new_empty((log_probs.shape[1], log_probs.shape[0], width) if batched else (log_probs.shape[0], width))
    return nll, alpha


@contextlib.contextmanager
def _fake_rules() -> Iterator[None]:
    """Fake-tensor rules for ATen ops torch cannot trace, registered only while capturing."""
    lib = torch.library.Library("aten", "FRAGMENT")
    try:
        for overload in ("aten::_ctc_loss.Tensor", "aten::_ctc_loss"):
            torch.library.register_fake(overload, _ctc_loss_fake, lib=lib)
        yield
    finally:
        lib._destroy()


def _param_buffer_metadata(params_buffers_to_node_meta: dict[str, Any], gm: torch.fx.GraphModule,
                           new_sig: Any) -> None:
    # torch's `_populate_param_buffer_metadata_to_new_gm`, with the signature's two lookup
    # tables built once: torch rebuilds them from every input spec for each placeholder
    # (quadratic in the state: 2,000 rebuilds of 660 specs for a ResNet-110)
    for metadata in params_buffers_to_node_meta.values():
        metadata.pop("nn_module_stack", None)
        metadata.pop("stack_trace", None)
    params, buffers = new_sig.inputs_to_parameters, new_sig.inputs_to_buffers
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        for table in (params, buffers):
            name = table.get(node.target)
            if name is not None and name in params_buffers_to_node_meta:
                node.meta.update(params_buffers_to_node_meta[name])


@contextlib.contextmanager
def _linear_signature_lookups() -> Iterator[None]:
    originals = [(m, m._populate_param_buffer_metadata_to_new_gm) for m in _SIGNATURE_USERS]
    for m, _ in originals:
        m._populate_param_buffer_metadata_to_new_gm = _param_buffer_metadata
    try:
        yield
    finally:
        for m, original in originals:
            m._populate_param_buffer_metadata_to_new_gm = original


# the modules that call it, each under its own imported name
_SIGNATURE_USERS = [importlib.import_module(n) for n in ("torch.export._trace", "torch.export.exported_program")]
_SIGNATURE_USERS = [m for m in _SIGNATURE_USERS if hasattr(m, "_populate_param_buffer_metadata_to_new_gm")]


def _frames_lines_on_demand(tb: list[dict[str, Any]], skip: int) -> traceback.StackSummary:
    """torch's `_extract_symbolized_tb`, with each frame's source line read when the frame is
    formatted rather than when it is made. fx records a stack trace per graph node (about 80
    frames, most of them torch's, each reading its line) and formats only the user's frames."""
    stack = traceback.StackSummary()
    for f in reversed(tb[skip:]):
        stack.append(traceback.FrameSummary(f["filename"], f["line"], f["name"], lookup_line=False))
    return stack


@contextlib.contextmanager
def _lines_on_demand() -> Iterator[None]:
    original = _torch_traceback._extract_symbolized_tb
    _torch_traceback._extract_symbolized_tb = _frames_lines_on_demand
    try:
        yield
    finally:
        _torch_traceback._extract_symbolized_tb = original


class _Frame(NamedTuple):
    """One frame as `traceback.StackSummary.from_list` takes it; its source line is read only
    if fx keeps the frame (from_list makes a FrameSummary of each frame it is given)."""

    filename: str
    lineno: int | None
    name: str
    line: str | None


class _PythonStack:
    """torch's `CapturedTraceback` as fx's `create_node` uses it (`extract().summary()`, once per
    node), reading the Python frames directly. torch gathers them in C++, then symbolizes every
    frame (file, line, name) and makes a FrameSummary of each (some 80 per node, most of them
    torch's), and fx keeps only the user's frames. Here the frames are walked as they are, and
    for a tracer that keeps only `forward` frames (`_record_forward_stack_traces_only`: export's
    module-stack tracer) only the frames its filter can keep are taken; fx's own filter then
    runs as before on them, so the text is the same."""

    __slots__ = ("frames",)

    def __init__(self, frames: list[tuple[Any, int | None]]) -> None:
        self.frames = frames

    @staticmethod
    def extract(*, script: bool = False, cpp: bool = False, skip: int = 0) -> Any:
        if script or cpp:  # frames other than Python's: torch's own
            return _TorchTraceback.extract(script=script, cpp=cpp, skip=skip)
        frame: Any = sys._getframe(1 + skip)  # from the caller, as torch elides extract()'s own
        # the caller is fx's Tracer.create_node: its tracer says which frames it keeps
        tracer = frame.f_locals.get("self") if skip == 0 else None
        forward_only = isinstance(tracer, _fx_proxy.TracerBase) and tracer._record_forward_stack_traces_only is True
        anchors = _fx_proxy._STACK_TRACE_ANCHORS
        frames = []
        while frame is not None:
            code = frame.f_code
            # TracerBase._filter_traceback_frames' test for that mode
            if not forward_only or code.co_name == "forward" or code.co_filename.endswith("torch/__init__.py") \
                    or (code.co_filename, code.co_name) in anchors:
                frames.append((code, frame.f_lineno))
            frame = frame.f_back
        return _PythonStack(frames)

    def summary(self) -> traceback.StackSummary:
        stack = traceback.StackSummary()
        stack.extend(_Frame(code.co_filename, line, code.co_name, None) for code, line in reversed(self.frames))
        return stack


_TorchTraceback = _fx_proxy.CapturedTraceback


@contextlib.contextmanager
def _python_stacks() -> Iterator[None]:
    _fx_proxy.CapturedTraceback = _PythonStack
    try:
        yield
    finally:
        _fx_proxy.CapturedTraceback = _TorchTraceback


_NAMED_MODULES = torch.nn.Module.named_modules


def _all_module_paths(root: torch.nn.Module) -> list[tuple[str, torch.nn.Module]] | None:
    """`root.named_modules(remove_duplicate=False)` as a list, walked with one loop instead of a
    generator per level of nesting (each module passes through every generator above it); None
    where some module has a `named_modules` of its own (torch's walk would call it)."""
    out: list[tuple[str, torch.nn.Module]] = []
    stack: list[tuple[str, torch.nn.Module]] = [("", root)]
    while stack:
        prefix, module = stack.pop()
        if type(module).named_modules is not _NAMED_MODULES or "named_modules" in module.__dict__:
            return None
        out.append((prefix, module))
        children = [(f"{prefix}.{name}" if prefix else name, child) for name, child in module._modules.items()
                    if child is not None]
        stack.extend(reversed(children))  # depth first, in registration order, as torch yields them
    return out


@contextlib.contextmanager
def _module_paths_walked_once() -> Iterator[None]:
    """export's module-stack tracer, made afresh for every branch it traces (a ResNet-110
    BlockDrop: 144 of them), walks the whole module tree twice in its constructor, each time
    through torch's recursive generators: for its duration the root answers that walk with one
    list, walked once, of the same (path, module) pairs in the same order."""
    original = proxy_tensor._ModuleStackTracer.__init__

    def init(self: Any, scope_root: torch.nn.Module) -> None:
        walked = _all_module_paths(scope_root)
        if walked is None:
            return original(self, scope_root)

        def named_modules(memo: Any = None, prefix: str = "", remove_duplicate: bool = True) -> Iterator:
            if memo is None and prefix == "" and remove_duplicate is False:
                return iter(walked)
            return _NAMED_MODULES(scope_root, memo, prefix, remove_duplicate)

        scope_root.__dict__["named_modules"] = named_modules
        try:
            original(self, scope_root)
        finally:
            del scope_root.__dict__["named_modules"]

    proxy_tensor._ModuleStackTracer.__init__ = init
    try:
        yield
    finally:
        proxy_tensor._ModuleStackTracer.__init__ = original


@contextlib.contextmanager
def capture_shims() -> Iterator[None]:
    """While active, `nn.Transformer*` layers do not inspect mask values to choose a kernel,
    ctc_loss with tensor lengths can be traced, and torch.distributions made without an
    explicit `validate_args` skip their argument checks.

    Those checks (`Bernoulli(probs)` tests 0 <= probs <= 1, `log_prob(a)` that `a` is in the
    support) are data-dependent Python branches that only raise; where they pass, the values are
    the same without them. So a converted program computes what torch computes on valid
    arguments; on invalid ones torch raises ValueError and the converted program does not check.

    Also torch.cond's schema and alias/mutation checks, and its branch traces, run once per
    distinct branch structure (branch_checks.py, branch_traces.py).

    Graph modules made meanwhile generate their Python code only when it is first read or run
    (torch's lazy graph module): export's passes recompile the root graph, and with it every
    branch sub-graph, after each change (ResNet-110 BlockDrop: about 3,000 code generations);
    and placeholder metadata is copied with the signature's lookup tables built once; the
    stack trace fx records per node reads source lines only for the frames it keeps, and fx's
    own per-node stacks are read from the Python frames (`_PythonStack`), not symbolized in full;
    export's module-stack tracer walks the module tree once per branch, not twice through
    torch's recursive generators.
    """
    original = _transformer._detect_is_causal_mask
    validate = Distribution._validate_args
    _transformer._detect_is_causal_mask = _causal_hint
    Distribution._validate_args = False
    try:
        with _fake_rules(), shared_branch_checks(), shared_branch_traces(), _use_lazy_graph_module(True), \
                _linear_signature_lookups(), _lines_on_demand(), _python_stacks(), _module_paths_walked_once():
            yield
    finally:
        _transformer._detect_is_causal_mask = original
        Distribution._validate_args = validate
