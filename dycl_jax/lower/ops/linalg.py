"""Matrix products: mm, bmm, addmm, baddbmm, addbmm, addmv, mv, dot, linear, _trilinear."""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import torch
from jax import lax

from dycl_jax.lower.interpreter import current_env, current_node
from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register


def _product(a, b, rhs: int):
    """a @ b for 2-D operands. Where b is `permute(w, [1, 0])` (torch's linear decomposes into
    `addmm(bias, x, permute(w))`), a contraction with w's second dimension instead: on a transpose
    whose product a bias add joins, XLA's CPU backend copies the transposed weight on every
    call (1 row by a 768x2048 weight: 1150 -> 86 us), and at other sizes it is as fast."""
    w = _untransposed(rhs)
    if w is not None and getattr(a, "ndim", 0) == 2 and getattr(w, "ndim", 0) == 2 \
            and a.dtype == w.dtype and a.shape[1] == w.shape[1]:
        return lax.dot_general(a, w, (((1,), (1,)), ((), ())))
    return jnp.matmul(a, b)


def _untransposed(index: int) -> Any:
    """The value w where argument `index` of the node being lowered is `permute(w, [1, 0])`, else None."""
    node, env = current_node(), current_env()
    if node is None or env is None or index >= len(node.args):
        return None
    arg = node.args[index]
    if not isinstance(arg, torch.fx.Node) or arg.target not in (aten.permute.default, aten.t.default):
        return None
    if arg.target is aten.permute.default and list(arg.args[1]) not in ([1, 0], [-1, -2], [1, -2], [-1, 0]):
        return None
    source = arg.args[0]
    return env.get(source) if isinstance(source, torch.fx.Node) else None


@register(aten.mm.default)
def mm(a, b):
    return _product(a, b, 1)


@register(aten.bmm.default)
def bmm(a, b):
    return jnp.matmul(a, b)


def _scaled_sum(bias, prod, beta, alpha):
    """beta·bias + alpha·prod, where beta == 0 ignores bias entirely (NaN/inf included), as torch.
    With integer operands torch truncates float alpha and beta to integers first (0.6 -> 0)."""
    if not jnp.issubdtype(jnp.result_type(bias, prod), jnp.inexact):
        beta, alpha = int(beta), int(alpha)
    if alpha != 1:
        prod = prod * alpha
    if beta == 0:
        return prod
    return prod + (bias if beta == 1 else bias * beta)


@register(aten.addmm.default)
def addmm(bias, a, b, *, beta=1, alpha=1):
    return _scaled_sum(bias, _product(a, b, 2), beta, alpha)


@register(aten.mv.default)
def mv(a, v):
    return jnp.matmul(a, v)


@register(aten.dot.default)
def dot(a, b):
    return jnp.dot(a, b)


@register(aten.addmv.default)
def addmv(bias, a, v, *, beta=1, alpha=1):
    return _scaled_sum(bias, jnp.matmul(a, v), beta, alpha)


@register(aten.baddbmm.default)
def baddbmm(bias, a, b, *, beta=1, alpha=1):
    return _scaled_sum(bias, jnp.matmul(a, b), beta, alpha)


@register(aten.addbmm.default)
def addbmm(bias, a, b, *, beta=1, alpha=1):
    # the batch of products is summed into one matrix
    return _scaled_sum(bias, jnp.einsum("bij,bjk->ik", a, b), beta, alpha)


@register(aten.linear.default)
def linear(x, weight, bias=None):
    out = jnp.matmul(x, jnp.swapaxes(weight, -1, -2)) if weight.ndim > 1 else jnp.matmul(x, weight)
    return out if bias is None else out + bias


@register(aten._trilinear.default)
def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    # F.bilinear's kernel: unsqueeze each operand at its `expand` dims, multiply the three
    # (broadcasting) and sum over `sumdim`. As an einsum, an expanded dim is simply absent
    # from that operand, which avoids materialising the broadcast product.
    ndim = i1.ndim + len(expand1)
    letters = [chr(ord("a") + d) for d in range(ndim)]

    def subscript(expand) -> str:
        return "".join(letters[d] for d in range(ndim) if d not in set(expand))

    out = "".join(letters[d] for d in range(ndim) if d not in set(sumdim))
    spec = f"{subscript(expand1)},{subscript(expand2)},{subscript(expand3)}->{out}"
    return jnp.einsum(spec, i1, i2, i3)
