"""Symmetric indefinite (Bunch-Kaufman) factorisation: linalg_ldl_factor_ex, as LAPACK's sytrf."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from dycl_jax.errors import UnsupportedOpError
from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register

# torch calls LAPACK's sytrf with the lower triangle. For the matrix sizes below its block size
# (64) that is the unblocked sytf2, replayed here step by step in the input's precision, with the
# same pivot rule, the same order of operations and the same 1-based pivots (negative: a 2x2
# block), so LD and pivots agree with torch bit for bit, not just up to rounding.


def _alpha(dtype) -> np.floating:
    """LAPACK's (1 + sqrt(17)) / 8, computed in the working precision as sytf2 does."""
    one = np.dtype(dtype).type(1)
    return (one + np.sqrt(np.dtype(dtype).type(17))) / np.dtype(dtype).type(8)


def _opaque(v, zero):
    """v as a value the compiler cannot rewrite through: XLA fuses a product into a following
    add (one FMA, one rounding) and turns (1 / x) / y into 1 / (x * y), where LAPACK rounds each
    step; OR-ing the bits with a zero it cannot see keeps v a separate, rounded value."""
    ints = {2: jnp.int16, 4: jnp.int32, 8: jnp.int64}[v.dtype.itemsize]
    bits = lax.bitcast_convert_type(v, ints) | zero.astype(ints)
    return lax.bitcast_convert_type(bits, v.dtype)


def _product(x, y, zero):
    return _opaque(x * y, zero)


def _step(n: int, alpha):
    idx = jnp.arange(n)
    rows, cols = idx[:, None], idx[None, :]

    def mirror(s):  # sytf2 updates only the lower triangle; keep the matrix symmetric from it
        return jnp.where(rows >= cols, s, s.T)

    def body(state):
        s, ipiv, k, info = state
        opaque = k >> 30  # 0 (k < n), but not a constant to the compiler
        absakk = jnp.abs(s[k, k])
        below = idx > k
        colvals = jnp.where(below, jnp.abs(s[:, k]), -jnp.inf)
        imax = jnp.argmax(colvals)  # the first largest, as idamax
        colmax = jnp.where(k < n - 1, colvals[imax], 0)
        rowvals = jnp.where((idx >= k) & (idx != imax), jnp.abs(s[:, imax]), -jnp.inf)
        rowmax = jnp.maximum(jnp.max(rowvals), 0)
        zero = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        keep = (absakk >= alpha * colmax) | (absakk >= alpha * colmax * (colmax / rowmax))
        one_by_one = keep | (jnp.abs(s[imax, imax]) >= alpha * rowmax)
        kstep = jnp.where(zero | one_by_one, 1, 2)
        kp = jnp.where(zero | keep, k, imax)
        kk = k + kstep - 1

        # interchange rows and columns kk and kp of the trailing block A[k:, k:]
        perm = jnp.where(idx == kk, kp, jnp.where(idx == kp, kk, idx))
        trailing = (rows >= k) & (cols >= k)
        swapped = jnp.where(trailing, s[perm][:, perm], s)

        def single(s):
            d11 = 1 / s[k, k]
            x = jnp.where(below, s[:, k], 0)
            temp = -d11 * x
            upd = jnp.where(below[:, None] & below[None, :], s + _product(x[:, None], temp[None, :], opaque), s)
            upd = jnp.where(below[:, None] & (cols == k), (x * d11)[:, None], upd)
            return mirror(upd)

        def double(s):
            d21 = s[k + 1, k]
            d11 = s[k + 1, k + 1] / d21
            d22 = s[k, k] / d21
            t = _opaque(1 / (_product(d11, d22, opaque) - 1), opaque)
            d21 = t / d21
            ck, ck1 = s[:, k], s[:, k + 1]
            wk = d21 * (_product(d11, ck, opaque) - ck1)
            wkp1 = d21 * (_product(d22, ck1, opaque) - ck)
            far = idx > k + 1
            block = far[:, None] & far[None, :]
            rank2 = s - _product(ck[:, None], wk[None, :], opaque) - _product(ck1[:, None], wkp1[None, :], opaque)
            upd = jnp.where(block, rank2, s)
            upd = jnp.where(far[:, None] & (cols == k), wk[:, None], upd)
            upd = jnp.where(far[:, None] & (cols == k + 1), wkp1[:, None], upd)
            return mirror(upd)

        updated = lax.cond(kstep == 1, single, double, swapped)
        s = jnp.where(zero, s, updated)
        piv = jnp.where(kstep == 1, kp + 1, -(kp + 1)).astype(jnp.int32)
        ipiv = ipiv.at[k].set(piv)
        ipiv = jnp.where((kstep == 2) & (idx == k + 1), piv, ipiv)
        info = jnp.where(zero & (info == 0), k + 1, info)
        return s, ipiv, k + kstep, info

    return body


def _factor_one(a):
    n = a.shape[-1]
    low = jnp.tril(a)
    s = low + jnp.tril(a, -1).T  # sytrf reads the lower triangle only
    state = (s, jnp.zeros((n,), jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    s, ipiv, _, info = lax.while_loop(lambda st: st[2] < n, _step(n, _alpha(a.dtype)), state)
    return jnp.tril(s), ipiv, info


@register(aten.linalg_ldl_factor_ex.default)
def linalg_ldl_factor_ex(a, *, hermitian: bool = False, check_errors: bool = False):
    if jnp.iscomplexobj(a):
        raise UnsupportedOpError(
            "linalg_ldl_factor_ex is lowered for real matrices only (complex Bunch-Kaufman pivots on |re|+|im|)",
            fix="factor the matrix in float32/float64, or keep this call in torch",
        )
    n = a.shape[-1]
    batch = a.shape[:-2]
    if n == 0 or 0 in batch:
        return a, jnp.zeros(batch + (n,), jnp.int32), jnp.zeros(batch, jnp.int32)
    ld, ipiv, info = jax.vmap(_factor_one)(a.reshape((-1, n, n)))
    return ld.reshape(a.shape), ipiv.reshape(batch + (n,)), info.reshape(batch)

