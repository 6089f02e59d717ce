"""torch.export's CompositeImplicitAutograd override for run_decompositions, installed faster."""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator

import torch
import torch.export.exported_program as _ep
from torch._export.utils import _get_decomp_for_cia
from torch._higher_order_ops.utils import autograd_not_implemented
from torch._subclasses.fake_impls import _deregister_op_impl, _is_op_registered_to_fake_rule, register_op_impl

_CIA = torch._C.DispatchKey.CompositeImplicitAutograd
_LOCK = threading.RLock()  # the override rewrites global operator tables: one decomposition at a time


@contextlib.contextmanager
def override_composite_implicit_decomp(cia_ops_to_callable: dict[Any, Callable]) -> Iterator[None]:
    """torch's `_override_composite_implicit_decomp` (torch/export/exported_program.py), the same
    kernels installed and restored, written into `py_kernels` directly: torch's `py_impl` per
    key (21 keys x ~525 ops, ~40 ms a decomposition) clears the op's dispatch cache each time;
    here it is cleared once per op, after its kernels are in place."""
    saved: dict[Any, dict] = {}
    try:
        for op, decomp in cia_ops_to_callable.items():
            kernels = op.py_kernels
            saved[op] = kernels.copy()
            not_implemented = None
            for key in _ep._AUTOGRAD_ALIAS_BACKEND_KEYS_TO_OVERRIDE:
                if key not in kernels:
                    # torch makes one per key; one per op behaves the same (a closure over op)
                    not_implemented = not_implemented or autograd_not_implemented(op, deferred_error=True)
                    kernels[key] = not_implemented
            orig_cia = _get_decomp_for_cia(op)  # before the CIA kernel is replaced, as torch
            kernels.pop(_CIA, None)
            kernels[_CIA] = decomp
            if not _is_op_registered_to_fake_rule(op):
                register_op_impl(op)(functools.partial(_force_dispatch_to_orig_cia, original_callable=orig_cia))
            for key in _ep._BACKEND_KEYS_TO_OVERRIDE:
                if key not in kernels:
                    kernels[key] = orig_cia
            op._dispatch_cache.clear()
        yield
    finally:
        for op, kernels in saved.items():
            op.py_kernels.clear()
            op.py_kernels.update(kernels)
            op._dispatch_cache.clear()
            _deregister_op_impl(op)


def _force_dispatch_to_orig_cia(fake_tensor_mode: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    # torch's fake rule for an overridden CIA op: run the original CIA kernel (see its
    # "[NOTE] Directly registering fake tensor rule to CIA ops")
    orig = kwargs.pop("original_callable")
    with fake_tensor_mode:
        return orig(*args, **kwargs)


@contextlib.contextmanager
def fast_override() -> Iterator[None]:
    """Make run_decompositions' tracing use `override_composite_implicit_decomp` for the block."""
    with _LOCK:
        original = _ep._override_composite_implicit_decomp
        _ep._override_composite_implicit_decomp = override_composite_implicit_decomp
        try:
            yield
        finally:
            _ep._override_composite_implicit_decomp = original
