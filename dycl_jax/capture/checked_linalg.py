"""Decompositions of torch.linalg functions that check their result (inv, tensorinv, cholesky, solve, lu_factor, ldl_factor)."""
from __future__ import annotations

from typing import Any, Callable

import torch

aten = torch.ops.aten

# torch decomposes these into their *_ex form plus `_linalg_check_errors`, an effectful op that
# raises on a singular or non-positive-definite input; export threads a token through the graph
# for it. A converted program cannot raise from inside XLA, so the check is left out: such an
# input gives the *_ex form's values (inf/NaN for a singular matrix) instead of torch's error.


def _inv(a: Any) -> Any:
    return aten.linalg_inv_ex.default(a)[0]


def _tensorinv(a: Any, ind: int = 2) -> Any:
    # torch's own composite: the inverse of `a` as a (prod(a.shape[ind:]))-square matrix, viewed
    # as a.shape[ind:] + a.shape[:ind]; it inlines the checked linalg_inv, so it needs its own entry
    head, tail = list(a.shape[:ind]), list(a.shape[ind:])
    n = 1
    for size in tail:
        n = n * size
    inverse = aten.linalg_inv_ex.default(aten.reshape.default(a, [n, n]))[0]
    return aten.view.default(inverse, tail + head)


def _cholesky(a: Any, upper: bool = False) -> Any:
    return aten.linalg_cholesky_ex.default(a, upper=upper)[0]


def _solve(a: Any, b: Any, left: bool = True) -> Any:
    return aten._linalg_solve_ex.default(a, b, left=left)[0]


def _lu_factor(a: Any, pivot: bool = True) -> Any:
    lu, pivots, _ = aten.linalg_lu_factor_ex.default(a, pivot=pivot)
    return lu, pivots


def _ldl_factor(a: Any, hermitian: bool = False) -> Any:
    ld, pivots, _ = aten.linalg_ldl_factor_ex.default(a, hermitian=hermitian)
    return ld, pivots


UNCHECKED: dict[Any, Callable[..., Any]] = {
    aten.linalg_inv.default: _inv,
    aten.linalg_tensorinv.default: _tensorinv,
    aten.linalg_cholesky.default: _cholesky,
    aten.linalg_solve.default: _solve,
    aten.linalg_lu_factor.default: _lu_factor,
    aten.linalg_ldl_factor.default: _ldl_factor,
}
