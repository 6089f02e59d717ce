"""Library code that torch.export cannot trace but whose answer never changes the result:
replaced by an equivalent while a graph is captured."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch.nn.modules.transformer as _transformer
from torch.distributions import Distribution


def _causal_hint(mask: Any, is_causal: bool | None = None, size: int | None = None) -> bool:
    # torch compares the mask with a causal one (a data-dependent bool) only to pick a fast
    # path; with the hint False the mask itself is applied, which gives the same values
    return is_causal is True


@contextlib.contextmanager
def capture_shims() -> Iterator[None]:
    """While active, `nn.Transformer*` layers do not inspect mask values to choose a kernel, and
    torch.distributions made without an explicit `validate_args` skip their argument checks.

    Those checks (`Bernoulli(probs)` tests 0 <= probs <= 1, `log_prob(a)` that `a` is in the
    support) are data-dependent Python branches that only raise; where they pass, the values are
    the same without them. So a converted program computes what torch computes on valid
    arguments; on invalid ones torch raises ValueError and the converted program does not check.
    """
    original = _transformer._detect_is_causal_mask
    validate = Distribution._validate_args
    _transformer._detect_is_causal_mask = _causal_hint
    Distribution._validate_args = False
    try:
        yield
    finally:
        _transformer._detect_is_causal_mask = original
        Distribution._validate_args = validate
