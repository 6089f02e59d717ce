"""Matrix factorisations: det, slogdet, svd, eig, eigh, qr, geqrf, Householder products, LU, Cholesky."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register

# torch and XLA's CPU backend both call LAPACK (getrf, gesdd, geev, syevd, geqrf, potrf), so
# factors agree, sign and phase conventions of singular and eigenvectors included.


def cholesky_info(a, upper: bool = False):
    """potrf's `info` per matrix, as torch's cholesky_ex returns it: the order of the first
    leading minor that is not positive definite (its pivot is <= 0 or NaN), else 0. XLA's
    Cholesky gives only NaNs then, so the pivots come from an unblocked factorisation of the
    triangle torch reads (the lower one; for `upper`, the upper one, as the lower of a^H)."""
    m = jnp.conj(jnp.swapaxes(a, -1, -2)) if upper else jnp.asarray(a)
    n = m.shape[-1]
    rows = jnp.arange(n)

    def step(j, carry):
        low, info = carry  # columns >= j of `low` are still zero
        row = low[..., j, :]
        pivot = jnp.real(m[..., j, j]) - jnp.sum(jnp.abs(row) ** 2, -1)
        bad = ~(pivot > 0)
        info = jnp.where((info == 0) & bad, j + 1, info)
        d = jnp.sqrt(jnp.where(bad, 1, pivot)).astype(m.dtype)  # once failed, only `info` matters
        col = (m[..., :, j] - jnp.einsum("...ik,...k->...i", low, jnp.conj(row))) / d[..., None]
        col = jnp.where(rows > j, col, jnp.where(rows == j, d[..., None], 0))
        return low.at[..., :, j].set(col), info

    info = jnp.zeros(m.shape[:-2], jnp.int32)
    return lax.fori_loop(0, n, step, (jnp.zeros_like(m), info))[1] if n else info


def lu_info(lu):
    """getrf's `info` per matrix, as torch's *_ex overloads return it: the 1-based index of the
    first exactly zero pivot of U (the matrix is singular), else 0."""
    diagonal = jnp.diagonal(lu, axis1=-2, axis2=-1)
    zero = diagonal == 0
    return jnp.where(zero.any(-1), jnp.argmax(zero, -1) + 1, 0).astype(jnp.int32)


def lu_factor(a):
    """(LU, 1-based int32 pivots) as torch's getrf returns them."""
    lu, pivots, _ = lax.linalg.lu(a)
    return lu, (pivots + 1).astype(jnp.int32)


def permutation(pivots, m: int):
    """perm with A[perm] = L @ U, from torch's 1-based pivots."""
    return lax.linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


@register(aten._linalg_det.default)
def linalg_det(a):
    return (jnp.linalg.det(a), *lu_factor(a))


@register(aten._linalg_slogdet.default)
def linalg_slogdet(a):
    sign, logabs = jnp.linalg.slogdet(a)
    return (sign, logabs, *lu_factor(a))


@register(aten._linalg_svd.default)
def linalg_svd(a, full_matrices=False, compute_uv=True, driver=None):
    # driver selects a CUDA solver; on the CPU torch uses gesdd, as XLA does
    if not compute_uv:
        empty = jnp.zeros((0,), a.dtype)
        return empty, jnp.linalg.svd(a, compute_uv=False), empty
    u, s, vh = jnp.linalg.svd(a, full_matrices=full_matrices)
    return u, s, vh


@register(aten.linalg_eig.default)
def linalg_eig(a):
    w, v = jnp.linalg.eig(a)
    return w, v


@register(aten._linalg_eigh.default)
def linalg_eigh(a, UPLO="L", compute_v=True):
    w, v = jnp.linalg.eigh(a, UPLO=UPLO, symmetrize_input=False)
    return w, (v if compute_v else jnp.zeros((0,), a.dtype))


@register(aten.linalg_qr.default)
def linalg_qr(a, mode="reduced"):
    if mode == "r":
        return jnp.zeros((0,), a.dtype), jnp.linalg.qr(a, mode="r")
    q, r = jnp.linalg.qr(a, mode=mode)
    return q, r


@register(aten.geqrf.default)
def geqrf(a):
    return lax.linalg.geqrf(a)


@register(aten.linalg_householder_product.default)
def householder_product(a, tau):
    return lax.linalg.householder_product(a, tau)


@register(aten.ormqr.default)
def ormqr(a, tau, c, left=True, transpose=False):
    """op(Q) @ c or c @ op(Q), Q the full m x m product of the reflectors stored in a."""
    m, k = a.shape[-2], a.shape[-1]
    # reflectors with tau = 0 are identities: pad to m of them for the full square Q
    a_full = jnp.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, m - k)]) if k < m else a[..., :m]
    tau_full = jnp.pad(tau, [(0, 0)] * (tau.ndim - 1) + [(0, m - tau.shape[-1])])
    q = lax.linalg.householder_product(a_full, tau_full)
    if transpose:
        q = jnp.conj(jnp.swapaxes(q, -1, -2))
    return jnp.matmul(q, c) if left else jnp.matmul(c, q)


@register(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(a, *, pivot=True, check_errors=False):
    lu, pivots = lu_factor(a)
    return lu, pivots, lu_info(lu)


def _unpack(lu, pivots, m: int, n: int):
    k = min(m, n)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    upper = jnp.triu(lu[..., :k, :])
    perm = permutation(pivots, m)
    # A = P L U with P^T A = A[perm], so P is the identity's rows in perm's order, transposed
    p = jnp.swapaxes(jnp.eye(m, dtype=lu.dtype)[perm], -1, -2)
    return p, lower, upper


@register(aten.linalg_lu.default)
def linalg_lu(a, *, pivot=True):
    m, n = a.shape[-2:]
    return _unpack(*lu_factor(a), m, n)


@register(aten.lu_unpack.default)
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    m, n = lu.shape[-2:]
    p, lower, upper = _unpack(lu, pivots, m, n)
    empty = jnp.zeros((0,), lu.dtype)
    return (p if unpack_pivots else empty, lower if unpack_data else empty, upper if unpack_data else empty)


@register(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(a, *, upper=False, check_errors=False):
    return cholesky(a, upper), cholesky_info(a, upper)


@register(aten.cholesky.default)
def cholesky(a, upper=False):
    # torch factors the Hermitian matrix of the triangle it reads (the lower, or the upper);
    # jnp.linalg.cholesky factors (a + a^H) / 2, another matrix where `a` is not Hermitian. The
    # gradient stays the symmetrised one, as torch's backward gives it.
    tri = jnp.triu if upper else jnp.tril
    mirrored = tri(a) + jnp.conj(jnp.swapaxes(tri(a, 1 if upper else -1), -1, -2))
    sym = (a + jnp.conj(jnp.swapaxes(a, -1, -2))) / 2
    low = lax.linalg.cholesky(sym + lax.stop_gradient(mirrored - sym), symmetrize_input=False)
    return jnp.conj(jnp.swapaxes(low, -1, -2)) if upper else low
