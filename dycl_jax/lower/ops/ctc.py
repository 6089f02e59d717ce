"""ctc_loss: the connectionist temporal classification loss (forward value), by the alpha recursion."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register


def _logsumexp(*xs):
    """log(sum(exp(x))) over the operands, -inf where all are -inf, with finite gradients there."""
    m = xs[0]
    for x in xs[1:]:
        m = jnp.maximum(m, x)
    safe_m = jnp.where(jnp.isfinite(m), m, 0)
    total = sum(jnp.exp(x - safe_m) for x in xs)
    return jnp.where(total > 0, jnp.log(jnp.where(total > 0, total, 1)) + safe_m, -jnp.inf)


def _padded_targets(targets, target_lengths, n: int):
    """(N, S) targets: as given when 2-D, else cut out of the concatenated 1-D targets."""
    if targets.ndim == 2:
        return targets
    starts = jnp.cumsum(target_lengths) - target_lengths
    width = targets.shape[0]  # a static bound on the longest target
    pos = starts[:, None] + jnp.arange(width)[None, :]
    return targets[jnp.clip(pos, 0, max(width - 1, 0))] if width else jnp.zeros((n, 0), targets.dtype)


def _ctc(log_probs, targets, input_lengths, target_lengths, blank: int, zero_infinity: bool):
    """(neg_log_likelihood (N,), log_alpha (N, T, 2S+1)) for (T, N, C) log-probabilities."""
    t_max, n, _ = log_probs.shape
    input_lengths = jnp.asarray(input_lengths).astype(jnp.int32)
    target_lengths = jnp.asarray(target_lengths).astype(jnp.int32)
    tgt = _padded_targets(jnp.asarray(targets), target_lengths, n).astype(jnp.int32)
    s = tgt.shape[1]
    width = 2 * s + 1
    # the extended label sequence: blank, l1, blank, l2, ..., blank
    ext = jnp.full((n, width), blank, jnp.int32).at[:, 1::2].set(tgt)
    pos = jnp.arange(width)
    # a skip from s-2 is allowed onto a label that differs from the label two places back
    prev2 = jnp.concatenate([jnp.full((n, 2), -1, jnp.int32), ext[:, :-2]], axis=1)
    can_skip = (pos[None, :] % 2 == 1) & (ext != prev2)
    lp = jnp.take_along_axis(log_probs, jnp.broadcast_to(ext[None], (t_max, n, width)), axis=2)  # (T, N, L)
    neg_inf = jnp.asarray(-jnp.inf, lp.dtype)
    alpha0 = jnp.where(pos[None, :] < 2, lp[0], neg_inf)
    alpha0 = jnp.where((pos[None, :] == 1) & (target_lengths[:, None] == 0), neg_inf, alpha0)

    def step(alpha, inputs):
        t, lp_t = inputs
        shift1 = jnp.concatenate([jnp.full((n, 1), neg_inf), alpha[:, :-1]], axis=1)
        shift2 = jnp.concatenate([jnp.full((n, 2), neg_inf), alpha[:, :-2]], axis=1)
        new = _logsumexp(alpha, shift1, jnp.where(can_skip, shift2, neg_inf)) + lp_t
        new = jnp.where((t < input_lengths)[:, None], new, alpha)  # a finished sequence keeps its alphas
        return new, new

    alpha_last, history = lax.scan(step, alpha0, (jnp.arange(1, t_max), lp[1:]))
    history = jnp.concatenate([alpha0[None], history], axis=0)
    end = 2 * target_lengths  # the last blank; the last label sits just before it
    last_blank = jnp.take_along_axis(alpha_last, end[:, None], axis=1)[:, 0]
    last_label = jnp.take_along_axis(alpha_last, jnp.maximum(end - 1, 0)[:, None], axis=1)[:, 0]
    last_label = jnp.where(target_lengths > 0, last_label, neg_inf)
    nll = -_logsumexp(last_blank, last_label)
    if zero_infinity:
        nll = jnp.where(jnp.isinf(nll), jnp.zeros((), nll.dtype), nll)
    return nll, jnp.swapaxes(history, 0, 1)


def _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity):
    if log_probs.ndim == 2:  # one unbatched sequence: (T, C), targets (S,)
        nll, alpha = _ctc(log_probs[:, None], jnp.asarray(targets)[None], jnp.asarray(input_lengths).reshape(1),
                          jnp.asarray(target_lengths).reshape(1), blank, zero_infinity)
        return nll[0], alpha[0]
    return _ctc(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity)


@register(aten._ctc_loss.Tensor)
def ctc_loss_tensor(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    return _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank, zero_infinity)


@register(aten._ctc_loss.default)
def ctc_loss_lists(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    nll, alpha = _ctc_loss(log_probs, targets, jnp.asarray(input_lengths), jnp.asarray(target_lengths), blank,
                           zero_infinity)
    # with the lengths known, log_alpha has torch's width
    width = 2 * max(target_lengths, default=0) + 1
    return nll, alpha[..., :width]
