"""Linear solves and inverses: triangular, Cholesky and LU solves, solve_ex, inv_ex, pinv, lstsq."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.ops.decompositions import lu_factor, lu_info, permutation
from dycl_jax.lower.registry import register


def _broadcast_batch(a, b):
    """a and b with their batch dims (all but the last two) broadcast to one shape, one dtype."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    dt = jnp.promote_types(a.dtype, b.dtype)
    return (jnp.broadcast_to(a, batch + a.shape[-2:]).astype(dt), jnp.broadcast_to(b, batch + b.shape[-2:]).astype(dt))


def _h(x):
    return jnp.conj(jnp.swapaxes(x, -1, -2))


@register(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    a, b = _broadcast_batch(a, b)
    return lax.linalg.triangular_solve(a, b, left_side=left, lower=not upper, unit_diagonal=unitriangular)


@register(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    """(X, A) with op(A) X = b, op transposing A when asked; A comes back as the clone torch returns."""
    a, b = _broadcast_batch(a, b)
    x = lax.linalg.triangular_solve(a, b, left_side=True, lower=not upper, transpose_a=transpose,
                                    unit_diagonal=unitriangular)
    return x, a


def _cho_solve(low, b):
    """X with L L^H X = b."""
    y = lax.linalg.triangular_solve(low, b, left_side=True, lower=True)
    return lax.linalg.triangular_solve(low, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True)


@register(aten.cholesky_solve.default)
def cholesky_solve(b, factor, upper=False):
    factor, b = _broadcast_batch(factor, b)
    return _cho_solve(_h(factor) if upper else factor, b)


@register(aten.cholesky_inverse.default)
def cholesky_inverse(factor, upper=False):
    eye = jnp.broadcast_to(jnp.eye(factor.shape[-1], dtype=factor.dtype), factor.shape)
    return _cho_solve(_h(factor) if upper else factor, eye)


def _lu_solve(lu, pivots, b, adjoint: bool):
    """X with A X = b (A^H X = b when adjoint), A given by its LU factors: A[perm] = L U."""
    lu, b = _broadcast_batch(lu, b)
    perm = permutation(pivots, lu.shape[-1])
    if not adjoint:
        pb = jnp.take_along_axis(b, jnp.broadcast_to(perm[..., None], b.shape), axis=-2)
        y = lax.linalg.triangular_solve(lu, pb, left_side=True, lower=True, unit_diagonal=True)
        return lax.linalg.triangular_solve(lu, y, left_side=True, lower=False)
    # A^H = U^H L^H P^T: solve U^H then L^H, then undo the row permutation
    y = lax.linalg.triangular_solve(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
    y = lax.linalg.triangular_solve(lu, y, left_side=True, lower=True, unit_diagonal=True, transpose_a=True,
                                    conjugate_a=True)
    inv = jnp.argsort(perm, axis=-1)
    return jnp.take_along_axis(y, jnp.broadcast_to(inv[..., None], y.shape), axis=-2)


@register(aten.linalg_lu_solve.default)
def linalg_lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    if left:
        return _lu_solve(lu, pivots, b, adjoint)
    # X A = B  <=>  A^H X^H = B^H
    return _h(_lu_solve(lu, pivots, _h(b), not adjoint))


@register(aten._linalg_solve_ex.default)
def linalg_solve_ex(a, b, *, left=True, check_errors=False):
    # B is a batch of vectors when it is 1-D or has A's shape without the last dim (torch's rule)
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])
    bm = b[..., None] if vector else b
    lu, pivots = lu_factor(a)
    if left:
        x = _lu_solve(lu, pivots, bm, False)
    else:
        x = _h(_lu_solve(lu, pivots, _h(bm), True))
    return (x[..., 0] if vector else x), lu, pivots, lu_info(lu)


@register(aten.linalg_inv_ex.default)
def linalg_inv_ex(a, *, check_errors=False):
    # a singular matrix: the values are inf/NaN, as torch's unchecked kernel gives, and `info` says so
    return jnp.linalg.inv(a), lu_info(lu_factor(a)[0])


@register(aten.linalg_pinv.atol_rtol_tensor)
def linalg_pinv(a, *, atol=None, rtol=None, hermitian=False):
    """The pseudo-inverse, dropping singular values at or below max(atol, rtol * largest)."""
    m, n = a.shape[-2:]
    if hermitian:
        # torch reads only the lower triangle, through eigh: the singular values are |w|
        w, v = jnp.linalg.eigh(a, UPLO="L", symmetrize_input=False)
        order = jnp.argsort(-jnp.abs(w), axis=-1)
        s = jnp.take_along_axis(jnp.abs(w), order, axis=-1)
        u = jnp.take_along_axis(v, jnp.broadcast_to(order[..., None, :], v.shape), axis=-1)
        vh = _h(u * jnp.sign(jnp.take_along_axis(w, order, axis=-1))[..., None, :])
    else:
        u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    real = s.dtype
    if rtol is None:
        # torch: rtol defaults to eps * max(m, n), or to 0 when a positive atol is given
        default = jnp.asarray(jnp.finfo(real).eps * max(m, n), real)
        rtol = default if atol is None else jnp.where(jnp.asarray(atol) > 0, 0, default)
    atol = jnp.zeros((), real) if atol is None else jnp.asarray(atol, real)
    smax = s[..., :1] if s.shape[-1] else jnp.zeros(s.shape[:-1] + (1,), real)
    cutoff = jnp.maximum(atol[..., None], jnp.asarray(rtol, real)[..., None] * smax)
    keep = s > cutoff
    s_inv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(a.dtype)
    return jnp.matmul(_h(vh) * s_inv[..., None, :], _h(u))


@register(aten.linalg_lstsq.default)
def linalg_lstsq(a, b, rcond=None, *, driver=None):
    """(solution, residuals, rank, singular values) as torch's CPU drivers return them: the
    minimum-norm least-squares solution through the SVD, singular values at or below
    rcond * largest (rcond defaulting to eps * max(m, n)) counting as zero. gelsy (the default)
    returns the rank only; gelsd/gelss also the singular values and, for m > n and full rank, the
    squared residual norms; gels the residuals only."""
    driver = driver or "gelsy"
    m, n = a.shape[-2:]
    vector = b.ndim == a.ndim - 1
    rhs = b[..., None] if vector else b
    batch = jnp.broadcast_shapes(a.shape[:-2], rhs.shape[:-2])
    a = jnp.broadcast_to(a, batch + a.shape[-2:])
    rhs = jnp.broadcast_to(rhs, batch + rhs.shape[-2:]).astype(a.dtype)
    u, s, vh = jnp.linalg.svd(a, full_matrices=False)
    real = s.dtype
    cutoff = jnp.asarray(jnp.finfo(real).eps * max(m, n) if rcond is None else rcond, real)
    smax = s[..., :1] if s.shape[-1] else jnp.zeros(s.shape[:-1] + (1,), real)
    keep = s > cutoff * smax
    s_inv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0).astype(a.dtype)
    x = jnp.matmul(_h(vh) * s_inv[..., None, :], jnp.matmul(_h(u), rhs))
    rank = keep.sum(-1)  # the interpreter casts it to torch's int64 (or its int32 form)
    empty = jnp.zeros((0,), real)
    residuals = empty
    if driver != "gelsy" and m > n:
        residuals = (jnp.abs(jnp.matmul(a, x) - rhs) ** 2).sum(-2)
        if not isinstance(keep, jax.core.Tracer) and not bool(jnp.all(rank == n)):
            residuals = empty  # torch leaves them out unless every matrix has full rank
        elif vector:
            residuals = residuals[..., 0]
    sv = s if driver in ("gelsd", "gelss") else empty
    if driver == "gels":
        rank = jnp.zeros((0,), rank.dtype)
    return (x[..., 0] if vector else x), residuals, rank, sv


def _ldl_solve_one(ld, piv, b, hermitian: bool):
    """LAPACK's sytrs/hetrs (lower) for one matrix: ld and 1-based pivots from sytrf (a negative
    pivot marks a 2x2 block, as in torch's ldl_factor), b of shape (n, k)."""
    n = ld.shape[-1]
    rows = jnp.arange(n)
    conj = jnp.conj if hermitian else (lambda v: v)

    def swap(b, i, j):
        bi, bj = b[i], b[j]
        return b.at[i].set(bj).at[j].set(bi)

    def forward(state):  # L D y = P b, one 1x1 or 2x2 block a step
        k, b = state
        p = piv[k]

        def single(b):
            b = swap(b, k, p - 1)
            b = b - jnp.where(rows > k, ld[:, k], 0)[:, None] * b[k][None, :]
            d = ld[k, k].real if hermitian else ld[k, k]
            return b.at[k].set(b[k] / d)

        def double(b):
            b = swap(b, k + 1, -p - 1)
            below = rows > k + 1
            b = b - jnp.where(below, ld[:, k], 0)[:, None] * b[k][None, :] \
                - jnp.where(below, ld[:, k + 1], 0)[:, None] * b[k + 1][None, :]
            off = ld[k + 1, k]
            akm1, ak = ld[k, k] / conj(off), ld[k + 1, k + 1] / off
            denom = akm1 * ak - 1
            bkm1, bk = b[k] / conj(off), b[k + 1] / off
            return b.at[k].set((ak * bkm1 - bk) / denom).at[k + 1].set((akm1 * bk - bkm1) / denom)

        return k + jnp.where(p > 0, 1, 2), lax.cond(p > 0, single, double, b)

    def backward(state):  # L^T x = y (L^H for hermitian), then the row interchanges
        k, b = state
        p = piv[k]
        below = rows > k
        b = b.at[k].add(-(jnp.where(below, conj(ld[:, k]), 0)[:, None] * b).sum(0))

        def single(b):
            return swap(b, k, p - 1)

        def double(b):
            b = b.at[k - 1].add(-(jnp.where(below, conj(ld[:, k - 1]), 0)[:, None] * b).sum(0))
            return swap(b, k, -p - 1)

        return k - jnp.where(p > 0, 1, 2), lax.cond(p > 0, single, double, b)

    zero = jnp.zeros((), jnp.int32)
    _, b = lax.while_loop(lambda s: s[0] < n, forward, (zero, b))
    _, b = lax.while_loop(lambda s: s[0] >= 0, backward, (zero + n - 1, b))
    return b


@register(aten.linalg_ldl_solve.default)
def linalg_ldl_solve(ld, pivots, b, *, hermitian: bool = False):
    batch = jnp.broadcast_shapes(ld.shape[:-2], b.shape[:-2])
    n, k = b.shape[-2:]
    ld = jnp.broadcast_to(ld, batch + ld.shape[-2:]).reshape((-1, n, n))
    piv = jnp.broadcast_to(pivots.astype(jnp.int32), batch + pivots.shape[-1:]).reshape((-1, n))
    rhs = jnp.broadcast_to(b, batch + (n, k)).reshape((-1, n, k)).astype(jnp.result_type(ld, b))
    if rhs.shape[0] == 0 or n == 0:
        return jnp.zeros(batch + (n, k), rhs.dtype)
    out = jax.vmap(lambda a, p, r: _ldl_solve_one(a, p, r, hermitian))(ld, piv, rhs)
    return out.reshape(batch + (n, k))
