"""Library code that torch.export cannot trace but whose answer never changes the result:
replaced by an equivalent while a graph is captured."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch.nn.modules.transformer as _transformer


def _causal_hint(mask: Any, is_causal: bool | None = None, size: int | None = None) -> bool:
    # torch compares the mask with a causal one (a data-dependent bool) only to pick a fast
    # path; with the hint False the mask itself is applied, which gives the same values
    return is_causal is True


@contextlib.contextmanager
def capture_shims() -> Iterator[None]:
    """While active, `nn.Transformer*` layers do not inspect mask values to choose a kernel."""
    original = _transformer._detect_is_causal_mask
    _transformer._detect_is_causal_mask = _causal_hint
    try:
        yield
    finally:
        _transformer._detect_is_causal_mask = original
