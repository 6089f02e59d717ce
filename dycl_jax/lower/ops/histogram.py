"""Histograms with a static number of bins: histc, histogram (bin count or bin edges)."""
from __future__ import annotations

import jax.numpy as jnp

from dycl_jax.lower.ops._util import aten
from dycl_jax.lower.registry import register


def _range(x, lo, hi, widen: float):
    """The histogram's range: the data's own where none is given; an empty one is widened."""
    if lo == hi:
        lo, hi = (x.min(), x.max()) if x.size else (jnp.zeros((), x.dtype), jnp.zeros((), x.dtype))
    lo, hi = jnp.asarray(lo, x.dtype), jnp.asarray(hi, x.dtype)
    same = lo == hi
    return jnp.where(same, lo - widen, lo), jnp.where(same, hi + widen, hi)


def _linear_counts(x, bins: int, lo, hi, weight=None):
    """Counts of x in `bins` equal bins over [lo, hi] (hi falls in the last bin; outside is dropped),
    with ATen's rule: the position by linear scaling, corrected by one against the edges."""
    x = x.reshape(-1)
    edges = jnp.linspace(lo, hi, bins + 1).astype(x.dtype)
    pos = jnp.floor((x - lo) * bins / (hi - lo)).astype(jnp.int32)
    pos = jnp.clip(pos, 0, bins - 1)
    pos = jnp.where((pos > 0) & (edges[pos] > x), pos - 1, pos)
    pos = jnp.where((pos < bins - 1) & (edges[pos + 1] <= x), pos + 1, pos)
    inside = (x >= lo) & (x <= hi)
    w = jnp.ones_like(x) if weight is None else weight.reshape(-1).astype(x.dtype)
    return jnp.zeros((bins,), x.dtype).at[pos].add(jnp.where(inside, w, 0)), edges


def _density(hist, edges):
    widths = edges[1:] - edges[:-1]
    return hist / (hist.sum() * widths)


@register(aten.histc.default)
def histc(x, bins=100, min=0, max=0):
    lo, hi = _range(x, min, max, 1.0)
    return _linear_counts(x, bins, lo, hi)[0]


@register(aten.histogram.bin_ct)
def histogram_bin_ct(x, bins=100, *, range=None, weight=None, density=False):
    lo, hi = _range(x, *(range if range is not None else (0.0, 0.0)), 0.5)
    hist, edges = _linear_counts(x, bins, lo, hi, weight)
    return (_density(hist, edges) if density else hist), edges


@register(aten.histogram.bins_tensor)
def histogram_bins_tensor(x, bins, *, weight=None, density=False):
    flat = x.reshape(-1)
    n = bins.shape[0] - 1
    pos = jnp.clip(jnp.searchsorted(bins, flat, side="right") - 1, 0, n - 1)  # the last edge closes the last bin
    inside = (flat >= bins[0]) & (flat <= bins[-1])
    w = jnp.ones_like(flat) if weight is None else weight.reshape(-1).astype(flat.dtype)
    hist = jnp.zeros((n,), flat.dtype).at[pos].add(jnp.where(inside, w, 0))
    return (_density(hist, bins) if density else hist), bins
