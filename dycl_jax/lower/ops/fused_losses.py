"""Fused losses: torch.nn.functional.linear_cross_entropy's chunked custom ops (linear + cross entropy)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch.nn.modules.linear_cross_entropy  # noqa: F401  (defines the torch_nn ops)
from torch import ops

from dycl_jax.errors import DyclError
from dycl_jax.lower.registry import register


def _per_sample(x, w, target, bias, weight, ignore_index: int, label_smoothing: float):
    """(loss per sample, its weight in a mean) of cross_entropy(linear(x, w, bias), target)."""
    if jnp.issubdtype(target.dtype, jnp.floating):
        raise DyclError("linear_cross_entropy with class-probability targets is not lowered",
                        fix="pass class indices as the target")
    acc = jnp.promote_types(x.dtype, jnp.float32)
    logits = jnp.matmul(x.astype(acc), w.astype(acc).T)
    if bias is not None:
        logits = logits + bias.astype(acc)
    logp = jax.nn.log_softmax(logits, axis=-1)
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0).astype(jnp.int32)
    cw = jnp.ones((logits.shape[-1],), acc) if weight is None else weight.astype(acc)
    sample_w = jnp.where(valid, cw[safe], 0)
    loss = -jnp.take_along_axis(logp, safe[:, None], axis=-1)[:, 0] * sample_w
    if label_smoothing > 0:
        # torch's smoothing term: the class-weighted sum of -log p over all classes, / C
        smooth = jnp.where(valid, -(logp * cw).sum(-1), 0)
        loss = (1 - label_smoothing) * loss + label_smoothing / logits.shape[-1] * smooth
    return loss, sample_w


def _reduced(x, w, target, bias, weight, reduction, ignore_index, label_smoothing):
    loss, sample_w = _per_sample(x, w, target, bias, weight, ignore_index, label_smoothing)
    return loss.sum() / sample_w.sum() if reduction == "mean" else loss.sum()


@register(ops.torch_nn._linear_cross_entropy_batch_chunked.default)
def linear_cross_entropy_chunked(x, w, target, bias, weight, reduction, ignore_index, label_smoothing,
                                 batch_chunk_size, acc_policy, acc_dtype, allow_retain_graph, compute_input_grad,
                                 compute_linear_weight_grad, compute_linear_bias_grad):
    # chunking and the accumulation policy change only memory use and rounding order
    def f(x, w, bias):
        return _reduced(x, w, target, bias, weight, reduction, ignore_index, label_smoothing)

    loss = f(x, w, bias)
    wants = (compute_input_grad, compute_linear_weight_grad, compute_linear_bias_grad and bias is not None)
    if any(wants):
        grads = jax.grad(f, argnums=(0, 1, 2) if bias is not None else (0, 1))(x, w, bias)
        grads = tuple(grads) + ((None,) if bias is None else ())
    else:
        grads = (None, None, None)
    empty = (jnp.zeros((0, 0), x.dtype), jnp.zeros((0, 0), x.dtype), jnp.zeros((0,), x.dtype))
    outs = tuple(g.astype(x.dtype) if want and g is not None else e for g, want, e in zip(grads, wants, empty))
    return (loss.astype(x.dtype), *outs)


@register(ops.torch_nn._linear_cross_entropy_batch_chunked_no_reduction.default)
def linear_cross_entropy_chunked_none(x, w, target, bias, weight, ignore_index, batch_chunk_size, acc_policy,
                                      acc_dtype):
    loss, _ = _per_sample(x, w, target, bias, weight, ignore_index, 0.0)
    return loss.astype(x.dtype)
