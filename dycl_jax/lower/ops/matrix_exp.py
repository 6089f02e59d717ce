"""The matrix exponential, by torch's scheme (optimised Taylor polynomials of degree 1 to 18)."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register

# torch (LinearAlgebra.cpp, after Bader, Blanes and Casas 2019) picks the degree from the
# operator 1-norm: below _THETAS[i] it uses the degree-_DEGREES[i] polynomial; from _THETAS[4]
# on it scales by 2**-s below _THETAS[5], takes degree 18 and squares s times. A batch of more
# than one matrix always takes the scaled degree 18. The polynomials are evaluated with the same
# products and coefficients so that the rounding matches too.
_THETAS = {
    np.float32: (1.192092800768788e-07, 5.978858893805233e-04, 5.116619363445086e-02,
                 5.800524627688768e-01, 1.461661507209034e+00, 3.010066362817634e+00),
    np.float64: (2.220446049250313e-16, 2.580956802971767e-08, 3.397168839976962e-04,
                 4.991228871115323e-02, 2.996158913811580e-01, 1.090863719290036e+00),
}
_B12 = (
    (9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740),
    (5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031, 0.01108844528519167989),
    (0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968, 0.00610700528898058230),
    (-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079, -0.00675951846863086359),
)
_B18 = (
    (0., -1.00365581030144618291e-01, -8.02924648241156932449e-03, -8.92138498045729985177e-04, 0.),
    (0., 3.97849749499645077844e-01, 1.36783778460411720168e+00, 4.98289622525382669416e-01,
     -6.37898194594723280150e-04),
    (-1.09676396052962061844e+01, 1.68015813878906206114e+00, 5.71779846478865511061e-02,
     -6.98210122488052056106e-03, 3.34975017086070470649e-05),
    (-9.04316832390810593223e-02, -6.76404519071381882256e-02, 6.75961301770459654925e-02,
     2.95552570429315521194e-02, -1.39180257516060693404e-05),
    (0., 0., -9.23364619367118555360e-02, -1.69364939002081722752e-02, -1.40086798182036094347e-05),
)


def _powers(a, count):
    """The first `count` of I, A, A^2, A^3, A^6."""
    out = [jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape), a]
    if count > 2:
        out.append(a @ a)
    if count > 3:
        out.append(a @ out[2])
    if count > 4:
        out.append(out[3] @ out[3])
    return out[:count]


def _combine(coefficients, mats):
    real = mats[0].real.dtype
    return sum(jnp.asarray(c, real).astype(mats[0].dtype) * m for c, m in zip(coefficients, mats))


def _t1(a, real):
    eye, a1 = _powers(a, 2)
    return eye + a1


def _t2(a, real):
    eye, a1, a2 = _powers(a, 3)
    return eye + a1 + a2 / 2


def _t4(a, real):
    eye, a1, a2 = _powers(a, 3)
    return _combine((1.0, 1.0, 0.0, 1.0), (eye, a1, a2, a2 @ _combine((1 / 2, 1 / 6, 1 / 24), (eye, a1, a2))))


def _t8(a, real):
    # torch's constants: sqrt(177) and 2/3 in the working precision, the rest from them in double
    sqrt_177, x3 = float(real(0.1330413469565007072504e+2)), float(real(2.0 / 3.0))
    x1, x2 = x3 * ((1 + sqrt_177) / 88), x3 * ((1 + sqrt_177) / 352)
    x4, x5 = (-271 + 29 * sqrt_177) / (315 * x3), (-11 + 11 * sqrt_177) / (1260 * x3)
    x6, x7 = (-99 + 11 * sqrt_177) / (5040 * x3), (89 - sqrt_177) / (5040 * x3)
    y2 = (857 - 58 * sqrt_177) / 630
    eye, a1, a2 = _powers(a, 3)
    a4 = a2 @ _combine((x1, x2), (a1, a2))
    a8 = _combine((x3, 1.0), (a2, a4)) @ _combine((x4, x5, x6, x7), (eye, a1, a2, a4))
    return _combine((1.0, 1.0, y2, 1.0), (eye, a1, a2, a8))


def _t12(a, real):
    b = [_combine(row, _powers(a, 4)) for row in _B12]
    b2 = b[2] + b[3] @ b[3]
    return b[0] + (b[1] + b2) @ b2


def _t18(a, real):
    b = [_combine(row, _powers(a, 5)) for row in _B18]
    b3 = b[3] + b[0] @ b[4]
    return b[1] + (b[2] + b3) @ b3


def _t18_scale_square(a, norm, theta, real):
    s = jnp.maximum(jnp.ceil(jnp.log2(norm / jnp.asarray(theta, real))), 0)
    x = _t18(a * jnp.exp2(-s).astype(a.dtype)[..., None, None], real)
    steps = s.astype(jnp.int32)

    def square(state):
        i, x = state
        return i + 1, jnp.where((i < steps)[..., None, None], x @ x, x)

    return lax.while_loop(lambda st: st[0] < steps.max(initial=0), square, (jnp.zeros((), jnp.int32), x))[1]


@register(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(a):
    n = a.shape[-1]
    if n == 0:
        return a
    if n == 1:
        return jnp.exp(a)
    # float16/bfloat16 compute in float32 (torch's CPU kernel reads its coefficients for them
    # wrongly, see tests/opinfo_known_failures.py: its results are not the exponential)
    work = a if a.dtype in (jnp.float32, jnp.float64, jnp.complex64, jnp.complex128) else a.astype(jnp.float32)
    real = np.float64 if work.real.dtype == jnp.float64 else np.float32
    thetas = _THETAS[real]
    norm = jnp.abs(work).sum(-2).max(-1)  # the operator 1-norm: the largest column sum
    if int(np.prod(a.shape[:-2])) > 1:
        return _t18_scale_square(work, norm, thetas[5], real).astype(a.dtype)
    # one matrix: the degree its norm needs; a NaN norm gives NaN, as torch's NaN-filled result
    degree = sum((norm > jnp.asarray(t, real)).astype(jnp.int32) for t in thetas[:4])
    degree = jnp.where(norm >= jnp.asarray(thetas[4], real), 5, degree)
    degree = jnp.where(jnp.isnan(norm), 6, degree)
    branches = [lambda x, f=f: f(x, real) for f in (_t1, _t2, _t4, _t8, _t12)]
    branches.append(lambda x: _t18_scale_square(x, jnp.abs(x).sum(-2).max(-1), thetas[5], real))
    branches.append(lambda x: jnp.full_like(x, jnp.nan))
    return lax.switch(degree.reshape(()), branches, work).astype(a.dtype)
