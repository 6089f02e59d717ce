"""A jaxpr's multiply-add work (convolutions and contractions), counted for the batching rule's choice."""
from __future__ import annotations

import math
from typing import Any

from jax.extend.core import ClosedJaxpr, Jaxpr


def flops(jaxpr: Jaxpr) -> float:
    """Floating-point operations of the convolutions and dot products in `jaxpr`, sub-jaxprs
    included: both branches of a cond (an upper bound for the one taken), a loop body once.
    Elementwise work is left out: it is what a select costs anyway, so it does not tell the
    two batching strategies apart."""
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2.0 * _size(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contract)
        elif name == "conv_general_dilated":
            rhs = eqn.invars[1].aval.shape
            out_feature = eqn.params["dimension_numbers"].rhs_spec[0]
            total += 2.0 * _size(eqn.outvars[0].aval.shape) * (_size(rhs) / max(rhs[out_feature], 1))
        for sub in _subjaxprs(eqn.params):
            total += flops(sub)
    return total


def _size(shape: tuple[int, ...]) -> float:
    return float(math.prod(int(d) for d in shape))


def _subjaxprs(params: dict[str, Any]) -> list[Jaxpr]:
    found = []
    for value in params.values():
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, ClosedJaxpr):
                found.append(item.jaxpr)
            elif isinstance(item, Jaxpr):
                found.append(item)
    return found
