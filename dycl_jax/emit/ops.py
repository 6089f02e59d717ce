"""The emission table: core-ATen op → jnp/lax expression text, one small rule per op family."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from dycl_jax.rewrite import modes  # noqa: F401  (registers torch.ops.dycl.decided)

aten = torch.ops.aten
_INT_MAX = 2**62  # torch writes "to the end" of a slice as a huge end index


class Expr(str):
    """The text of one array (or Python int) expression in emitted code."""


@dataclass(frozen=True)
class Rule:
    """How one op becomes text. `dtype`: "promote" (elementwise, JAX promotion of the inputs),
    "first" (the first tensor input's), "own" (the template sets its dtype itself); the emitter
    adds a cast where torch recorded another dtype. `parts`: a tuple-valued op whose getitem k
    the template returns for k in `parts` (other items have no rule)."""

    text: Callable[..., str]
    dtype: str = "first"
    parts: tuple[int, ...] = ()
    # the text repeats an argument: arguments must be names, not expressions (a function of the
    # fx node: only where that node's text repeats one)
    named: bool | Callable[[Any], bool] = False
    node: bool = False  # the template reads torch's metadata: it gets the fx node as `node=`


RULES: dict[Any, Rule] = {}


def rule(*ops: Any, dtype: str = "first", parts: tuple[int, ...] = (), named: bool | Callable[[Any], bool] = False,
         node: bool = False) -> Callable:
    def deco(fn: Callable[..., str]) -> Callable[..., str]:
        for op in ops:
            assert op not in RULES, op  # one rule per overload, as in the lowering registry
            RULES[op] = Rule(fn, dtype, parts, named, node)
        return fn
    return deco


def lit(v: Any) -> str:
    """A Python value as source text (lists of ints become tuples, dtypes jnp names)."""
    if isinstance(v, Expr):
        return str(v)
    if isinstance(v, (list, tuple)):
        items = [lit(x) for x in v]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(v, torch.dtype):
        return dtype_text(v)
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return {"inf": "jnp.inf", "-inf": "-jnp.inf"}.get(str(v), "jnp.nan")
    return repr(v)


def dtype_text(dt: torch.dtype) -> str:
    # int64 is held as int32, as in the converted program's default policy
    name = {torch.int64: "int32", torch.float64: "float64", torch.bool: "bool_"}.get(dt, str(dt).replace("torch.", ""))
    return f"jnp.{name}"


def _axes(dims: Any) -> str:
    return lit(tuple(dims)) if isinstance(dims, (list, tuple)) else lit(dims)


def _binary(sym: str) -> Callable[..., str]:
    def text(a: Any, b: Any, alpha: Any = 1, **_: Any) -> str:
        rhs = lit(b) if alpha == 1 else f"{lit(alpha)} * {lit(b)}"
        return f"{lit(a)} {sym} {rhs}"
    return text


for _op, _sym in ((aten.add, "+"), (aten.sub, "-")):
    rule(_op.Tensor, _op.Scalar, dtype="promote")(_binary(_sym))
for _op, _sym in ((aten.mul, "*"), (aten.div, "/"), (aten.eq, "=="), (aten.ne, "!="), (aten.gt, ">"),
                  (aten.ge, ">="), (aten.lt, "<"), (aten.le, "<=")):
    rule(_op.Tensor, _op.Scalar, dtype="own" if _sym not in "*/" else "promote")(_binary(_sym))
rule(aten.logical_and.default, dtype="own")(lambda a, b: f"jnp.logical_and({lit(a)}, {lit(b)})")
rule(aten.logical_or.default, dtype="own")(lambda a, b: f"jnp.logical_or({lit(a)}, {lit(b)})")
rule(aten.logical_not.default, dtype="own")(lambda a: f"jnp.logical_not({lit(a)})")
rule(aten.remainder.Scalar, aten.remainder.Tensor, dtype="promote")(lambda a, b: f"jnp.remainder({lit(a)}, {lit(b)})")
rule(aten.where.self, dtype="promote")(lambda c, a, b: f"jnp.where({lit(c)}, {lit(a)}, {lit(b)})")

for _name, _fn in (("relu", "jax.nn.relu"), ("sigmoid", "jax.nn.sigmoid"), ("tanh", "jnp.tanh"), ("exp", "jnp.exp"),
                   ("log", "jnp.log"), ("neg", "jnp.negative"), ("sqrt", "jnp.sqrt"), ("rsqrt", "jax.lax.rsqrt"),
                   ("abs", "jnp.abs")):
    rule(getattr(aten, _name).default)(lambda a, _fn=_fn: f"{_fn}({lit(a)})")
rule(aten.detach.default)(lambda a: f"jax.lax.stop_gradient({lit(a)})")
rule(aten.clone.default, aten.alias.default)(lambda a, **_: lit(a))  # arrays are values: a copy is the array
# a padded program's decision (rewrite/modes.py) is its predicate: the in-memory model records it
rule(torch.ops.dycl.decided.default)(lambda pred, reach, site: lit(pred))
rule(aten._softmax.default)(lambda a, dim, half: f"jax.nn.softmax({lit(a)}, axis={dim})")
rule(aten._log_softmax.default)(lambda a, dim, half: f"jax.nn.log_softmax({lit(a)}, axis={dim})")
rule(aten._to_copy.default, dtype="own")(
    lambda a, dtype=None, **_: lit(a) if dtype is None else f"{lit(a)}.astype({dtype_text(dtype)})")

# reductions
rule(aten.mean.dim)(lambda a, dims, keepdim=False, **_: f"jnp.mean({lit(a)}, axis={_axes(dims)}, keepdims={keepdim})")
rule(aten.sum.dim_IntList, dtype="own")(
    lambda a, dims, keepdim=False, dtype=None: f"jnp.sum({lit(a)}, axis={_axes(dims) if dims else None}, keepdims={keepdim})")
rule(aten.max.default)(lambda a: f"jnp.max({lit(a)})")
rule(aten.amax.default)(lambda a, dims=(), keepdim=False: f"jnp.max({lit(a)}, axis={_axes(dims) if dims else None}, keepdims={keepdim})")
rule(aten.max.dim, aten.min.dim, named=True, node=True)(  # (values, indices): the first index among ties, as torch
    lambda a, dim, keepdim=False, node=None: tuple(
        f"jnp.{f}{'max' if node.target is aten.max.dim else 'min'}({lit(a)}, axis={dim}, keepdims={keepdim})"
        for f in ("", "arg")))
rule(aten.argmax.default, dtype="own")(
    lambda a, dim=None, keepdim=False: f"jnp.argmax({lit(a)}, axis={dim}, keepdims={keepdim})")

# shapes (the graph's shape arguments already hold `x.shape[0]` where the batch is dynamic)
rule(aten.sym_size.int, dtype="own")(lambda a, d: f"{lit(a)}.shape[{d}]")
rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default)(lambda a, shape: f"{lit(a)}.reshape({lit(shape)})")
rule(aten.permute.default)(lambda a, dims: f"{lit(a)}.transpose({lit(dims)})")
rule(aten.unsqueeze.default)(lambda a, d: f"jnp.expand_dims({lit(a)}, {d})")
rule(aten.cat.default, dtype="promote")(lambda xs, dim=0: f"jnp.concatenate([{', '.join(lit(x) for x in xs)}], axis={dim})")
rule(aten.index_select.default)(lambda a, dim, idx: f"jnp.take({lit(a)}, {lit(idx)}, axis={dim})")
# -1 keeps the input's size: torch's sizes from the graph, the input's own where it is symbolic (the batch)
rule(aten.expand.default, node=True, named=lambda n: any(isinstance(s, Expr) for s in _expanded(n.args[1], n)))(
    lambda a, shape, node, **_: f"jnp.broadcast_to({lit(a)}, {lit(_expanded(shape, node, a))})")


def _dim(dim: int, node: Any) -> int:
    return dim % node.args[0].meta["val"].dim() if dim < 0 else dim  # `[:, :, i]` needs it counted from the front


@rule(aten.select.int, node=True)
def _select(a: Any, dim: int, index: Any, node: Any) -> str:
    return f"{lit(a)}[{':, ' * _dim(dim, node)}{lit(index)}]"


@rule(aten.slice.Tensor, node=True)
def _slice(a: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1, node: Any = None) -> str:
    dim = _dim(dim, node)
    start = "" if start in (None, 0) else lit(start)
    end = "" if end is None or (isinstance(end, int) and end >= _INT_MAX) else lit(end)
    step_text = "" if step == 1 else f":{step}"
    return f"{lit(a)}[{':, ' * dim}{start}:{end}{step_text}]"


@rule(aten.constant_pad_nd.default, node=True, named=True)
def _constant_pad_nd(a: Any, pad: Any, value: Any = 0, node: Any = None) -> str:
    # (before, after) pairs from the last dim backwards; lax.pad crops on negative amounts, as torch does
    cfg = [(0, 0, 0)] * node.args[0].meta["val"].dim()
    for i in range(len(pad) // 2):
        cfg[len(cfg) - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return f"jax.lax.pad({lit(a)}, jnp.asarray({lit(value)}, {lit(a)}.dtype), {lit(cfg)})"


@rule(aten.full.default, dtype="own")
def _full(size: Any, value: Any, dtype: Any = None, **_: Any) -> str:
    return f"jnp.full({lit(size)}, {lit(value)}, {dtype_text(dtype) if dtype else 'jnp.float32'})"


# products and network ops on torch's NCHW layout (standard layers are recognised before these)
rule(aten.mm.default, aten.bmm.default, dtype="promote")(lambda a, b: f"{lit(a)} @ {lit(b)}")
rule(aten.addmm.default, dtype="promote")(lambda bias, a, b, **_: f"{lit(bias)} + {lit(a)} @ {lit(b)}")
rule(aten.embedding.default)(lambda w, idx, *_: f"jnp.take({lit(w)}, {lit(idx)}, axis=0)")


@rule(aten.convolution.default)
def _conv(x: Any, w: Any, b: Any, stride: Any, padding: Any, dilation: Any, transposed: bool, out_pad: Any,
          groups: int) -> str:
    if transposed or len(stride) != 2:
        raise KeyError("convolution")  # only the 2-d forward convolution has a rule
    text = (f"jax.lax.conv_general_dilated({lit(x)}, {lit(w)}, {lit(stride)}, {lit([(p, p) for p in padding])}, "
            f"rhs_dilation={lit(dilation)}, dimension_numbers=('NCHW', 'OIHW', 'NCHW'), feature_group_count={groups})")
    return text if b is None else f"{text} + {lit(b)}[:, None, None]"


@rule(aten._native_batch_norm_legit_no_training.default, parts=(0,), named=True)
def _batch_norm(x: Any, w: Any, b: Any, mean: Any, var: Any, momentum: float, eps: float) -> str:
    def col(v: Any) -> str:
        return f"{lit(v)}.reshape(-1, *([1] * ({lit(x)}.ndim - 2)))"
    out = f"({lit(x)} - {col(mean)}) * jax.lax.rsqrt({col(var)} + {eps!r})"
    if w is not None:
        out = f"{out} * {col(w)}"
    return out if b is None else f"{out} + {col(b)}"


def _pool_pads(node: Any, kernel: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool) -> tuple:
    """(kernel, stride, [(low, high)] per spatial axis, overhang per axis) of a 2-d pooling: torch's
    padding, plus on the high side whatever a ceil-mode window reaches beyond it (spatial sizes are
    static; a window that would start inside the right padding is dropped, as torch does)."""
    sizes = node.args[0].meta["val"].shape[-2:]
    if not all(isinstance(n, int) for n in sizes):
        raise KeyError("pooling over symbolic spatial sizes")
    two = lambda v, d: tuple(v) * (2 // len(v)) if v else d  # noqa: E731  (ATen: one value or two)
    k = two(kernel, None)
    s, p, d = two(stride, k), two(padding, (0, 0)), two(dilation, (1, 1))
    pads, over = [], []
    for n, ki, si, pi, di in zip(sizes, k, s, p, d):
        span = n + 2 * pi - di * (ki - 1) - 1
        out = (-(-span // si) if ceil_mode else span // si) + 1
        if ceil_mode and (out - 1) * si >= n + pi:
            out -= 1
        high = max(pi, (out - 1) * si + di * (ki - 1) + 1 - n - pi)
        pads.append((pi, high))
        over.append(high - pi)
    return k, s, d, pads, tuple(sizes), over


def _window(x: Any, init: str, op: str, kernel: Any, stride: Any, pads: list, dilation: Any = (1, 1)) -> str:
    dil = "" if tuple(dilation) == (1, 1) else f", window_dilation={lit((1, 1, *dilation))}"
    return (f"jax.lax.reduce_window({lit(x)}, {init}, {op}, {lit((1, 1, *kernel))}, {lit((1, 1, *stride))}, "
            f"{lit([(0, 0), (0, 0), *pads])}{dil})")


@rule(aten.max_pool2d_with_indices.default, parts=(0,), node=True)
def _max_pool(x: Any, kernel: Any, stride: Any = (), padding: Any = (0, 0), dilation: Any = (1, 1),
              ceil_mode: bool = False, node: Any = None) -> str:
    k, s, d, pads, _, _ = _pool_pads(node, kernel, stride, padding, dilation, ceil_mode)
    return _window(x, "-jnp.inf", "jax.lax.max", k, s, pads, d)


@rule(aten.avg_pool2d.default, node=True)
def _avg_pool(x: Any, kernel: Any, stride: Any = (), padding: Any = (0, 0), ceil_mode: bool = False,
              count_include_pad: bool = True, divisor: Any = None, node: Any = None) -> str:
    k, s, _, pads, (h, w), over = _pool_pads(node, kernel, stride, padding, (), ceil_mode)
    total = _window(x, "0.0", "jax.lax.add", k, s, pads)
    if divisor is not None:
        return f"{total} / {lit(divisor)}"
    if count_include_pad and not any(over):
        return f"{total} / {k[0] * k[1]}"
    # torch divides by the window's count of input positions (and of padding, with count_include_pad,
    # but never of a ceil-mode window's overhang): the same window summing ones
    if count_include_pad:
        (ph, _), (pw, _) = pads
        ones, ones_pads = f"jnp.ones(({h + 2 * ph}, {w + 2 * pw}))", [(0, o) for o in over]
    else:
        ones, ones_pads = f"jnp.ones(({h}, {w}))", pads
    return f"{total} / jax.lax.reduce_window({ones}, 0.0, jax.lax.add, {lit(k)}, {lit(s)}, {lit(ones_pads)})"


@rule(aten.adaptive_max_pool2d.default, parts=(0,))
def _adaptive_max(x: Any, size: Any) -> str:
    if tuple(size) != (1, 1):
        raise KeyError("adaptive_max_pool2d")
    return f"jnp.max({lit(x)}, axis=(2, 3), keepdims=True)"


@rule(aten.native_layer_norm.default, parts=(0,), named=True)
def _layer_norm(x: Any, shape: Any, w: Any, b: Any, eps: float) -> str:
    axes = lit(tuple(range(-len(shape), 0)))
    out = (f"({lit(x)} - jnp.mean({lit(x)}, axis={axes}, keepdims=True)) * "
           f"jax.lax.rsqrt(jnp.var({lit(x)}, axis={axes}, keepdims=True) + {eps!r})")
    if w is not None:
        out = f"{out} * {lit(w)}"
    return out if b is None else f"{out} + {lit(b)}"


@rule(aten.squeeze.dims, aten.squeeze.dim, node=True)
def _squeeze(a: Any, dims: Any, node: Any) -> str:
    # torch leaves a dimension that is not of size 1 in place; jnp would raise
    shape = node.args[0].meta["val"].shape
    dims = [dims] if isinstance(dims, int) else dims
    keep = tuple(d % len(shape) for d in dims if len(shape) and isinstance(shape[d], int) and shape[d] == 1)
    return f"jnp.squeeze({lit(a)}, axis={lit(keep)})" if keep else lit(a)


@rule(aten.split_with_sizes.default, aten.split.Tensor, named=True)
def _split(a: Any, sizes: Any, dim: int = 0) -> tuple[str, ...]:
    if isinstance(sizes, int):
        raise KeyError("split with a chunk size")  # the item count needs the shape
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    return tuple(f"jax.lax.slice_in_dim({lit(a)}, {s}, {s + n}, axis={dim})" for s, n in zip(starts, sizes))


@rule(aten.arange.start_step, aten.arange.start, aten.arange.default, dtype="own", node=True)
def _arange(*bounds: Any, node: Any, **_: Any) -> str:
    # the dtype torch chose (int64 for integer bounds, the default float otherwise)
    return f"jnp.arange({', '.join(lit(b) for b in bounds)}, dtype={dtype_text(node.meta['val'].dtype)})"


rule(aten.any.default, dtype="own")(lambda a: f"jnp.any({lit(a)})")
rule(aten.all.default, dtype="own")(lambda a: f"jnp.all({lit(a)})")
rule(aten.any.dim, dtype="own")(lambda a, dim, keepdim=False: f"jnp.any({lit(a)}, axis={dim}, keepdims={keepdim})")


@rule(aten.full_like.default, aten.zeros_like.default, aten.ones_like.default, dtype="own", node=True)
def _full_like(a: Any, *value: Any, node: Any, **_: Any) -> str:
    fill = value[0] if value else (0 if node.target is aten.zeros_like.default else 1)
    return f"jnp.full_like({lit(a)}, {lit(fill)}, dtype={dtype_text(node.meta['val'].dtype)})"


rule(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, dtype="promote")(lambda a, b: f"{lit(a)} ** {lit(b)}")


@rule(aten.linalg_vector_norm.default)
def _vector_norm(a: Any, ord: Any = 2, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> str:
    axis = _axes(dim) if dim else None
    return f"jnp.linalg.vector_norm({lit(a)}, ord={lit(float(ord))}, axis={axis}, keepdims={keepdim})"


rule(aten.gelu.default)(lambda a, approximate="none": f"jax.nn.gelu({lit(a)}, approximate={approximate == 'tanh'})")
rule(aten.mean.default)(lambda a, dtype=None: f"jnp.mean({lit(a)})")
rule(aten.sum.default, dtype="own")(lambda a, dtype=None: f"jnp.sum({lit(a)})")


rule(aten.any.dims, dtype="own")(
    lambda a, dim=None, keepdim=False: f"jnp.any({lit(a)}, axis={_axes(dim) if dim else None}, keepdims={keepdim})")


@rule(aten._adaptive_avg_pool2d.default, node=True, named=True)
def _adaptive_avg(x: Any, size: Any, node: Any) -> str:
    if tuple(size) == (1, 1):
        return f"jnp.mean({lit(x)}, axis=(2, 3), keepdims=True)"
    *lead, h, w = node.args[0].meta["val"].shape
    oh, ow = size
    if len(lead) != 2 or not all(isinstance(d, int) for d in (lead[1], h, w)):
        raise KeyError("_adaptive_avg_pool2d over symbolic sizes")
    if h % oh or w % ow:  # bins of unequal sizes or overlapping: torch's bins, one by one
        return f"adaptive_avg_pool2d({lit(x)}, {lit((oh, ow))})"
    # equal windows: each output cell the mean of its (h/oh, w/ow) block
    return (f"jnp.mean({lit(x)}.reshape({lit(x)}.shape[0], {lead[1]}, {oh}, {h // oh}, {ow}, {w // ow}), "
            f"axis=(3, 5))")


NO_VALUE = {aten._assert_tensor_metadata.default}  # checks only: they emit nothing


def _expanded(shape: Any, node: Any, a: Any = "x") -> Any:
    have = node.args[0].meta["val"].shape
    lead = len(shape) - len(have)
    return [s if not (isinstance(s, int) and s == -1) else have[i - lead] if isinstance(have[i - lead], int)
            else Expr(f"{lit(a)}.shape[{i - lead}]") for i, s in enumerate(shape)]


def _indices(idx: Any) -> str:
    # advanced indexing as numpy's (torch's): None keeps a dimension whole
    return ", ".join(":" if i is None else lit(i) for i in idx) + ("," if len(idx) == 1 else "")


rule(aten.bitwise_or.Tensor, dtype="promote")(lambda a, b: f"{lit(a)} | {lit(b)}")
rule(aten.bitwise_and.Tensor, dtype="promote")(lambda a, b: f"{lit(a)} & {lit(b)}")
rule(aten.bitwise_not.default)(lambda a: f"jnp.invert({lit(a)})")
rule(aten.copy.default, named=True)(  # the source's values in the destination's shape and dtype
    lambda dst, src, non_blocking=False: f"jnp.broadcast_to({lit(src)}, {lit(dst)}.shape).astype({lit(dst)}.dtype)")
rule(aten.scalar_tensor.default, dtype="own")(
    lambda v, dtype=None, **_: f"jnp.asarray({lit(v)}, {dtype_text(dtype) if dtype else 'jnp.float32'})")
rule(aten.index.Tensor)(lambda a, idx: f"{lit(a)}[{_indices(idx)}]")
rule(aten.index_put.default)(lambda a, idx, v, accumulate=False:
                             f"{lit(a)}.at[{_indices(idx)}].{'add' if accumulate else 'set'}({lit(v)})")
rule(aten.var.correction)(  # torch's correction is numpy's ddof
    lambda a, dims=None, correction=1, keepdim=False:
    f"jnp.var({lit(a)}, axis={_axes(dims) if dims else None}, ddof={lit(1 if correction is None else correction)}, "
    f"keepdims={keepdim})")
rule(torch.sym_max, dtype="own")(lambda a, b: f"max({lit(a)}, {lit(b)})")  # sizes: Python ints at trace time
rule(torch.sym_min, dtype="own")(lambda a, b: f"min({lit(a)}, {lit(b)})")

# Random ops of a train-mode program. `keys()` is the call's next key (the emitted RandomKeys):
# the n-th random op traced draws fold_in(key, n), as the converted model's do (lower/keys.py),
# so the same key gives the same values; an op that draws nothing there takes no key here either.
KEYS = "keys"
RANDOM = {aten.native_dropout.default, aten.bernoulli.p, aten.rand_like.default, aten.randn_like.default}


@rule(aten.native_dropout.default, parts=(0,))
def _dropout(x: Any, p: float, train: Any) -> str:
    if not train or p == 0:
        return lit(x)
    if p >= 1:
        return f"jnp.zeros_like({lit(x)})"  # torch zeroes everything (its scale would be infinite)
    return f"dropout({lit(x)}, {lit(p)}, {KEYS}())"


rule(aten.bernoulli.p, dtype="own")(
    lambda x, p=0.5, generator=None: f"jax.random.bernoulli({KEYS}(), {lit(p)}, {lit(x)}.shape).astype({lit(x)}.dtype)")


def _drawn(fn: str) -> Callable[..., str]:
    def text(x: Any, dtype: Any = None, **_: Any) -> str:
        want = dtype_text(dtype) if dtype is not None else f"{lit(x)}.dtype"
        # drawn in float32 at least, then rounded once (the converted model's rule)
        return (f"jax.random.{fn}({KEYS}(), {lit(x)}.shape, jnp.promote_types({want}, jnp.float32))"
                f".astype({want})")
    return text


rule(aten.rand_like.default, dtype="own")(_drawn("uniform"))
rule(aten.randn_like.default, dtype="own")(_drawn("normal"))
rule(aten.reciprocal.default)(lambda a: f"1 / {lit(a)}")  # an integer input gives torch's float (the cast added)
rule(aten.flip.default)(lambda a, dims: f"jnp.flip({lit(a)}, axis={_axes(dims)})")



@rule(aten.clamp.default, dtype="promote")
def _clamp(x: Any, min: Any = None, max: Any = None) -> str:  # noqa: A002 (ATen argument names)
    # max then min, as torch: NaN propagates and min > max gives max
    out = lit(x) if min is None else f"jnp.maximum({lit(x)}, {lit(min)})"
    return out if max is None else f"jnp.minimum({out}, {lit(max)})"


rule(aten.hardtanh.default)(lambda a, lo=-1.0, hi=1.0: f"jnp.clip({lit(a)}, {lit(lo)}, {lit(hi)})")


@rule(aten.upsample_bilinear2d.vec, aten.upsample_nearest2d.vec, named=True, node=True)
def _resize(x: Any, size: Any, *rest: Any, node: Any) -> str:
    # jax.image.resize samples at half-pixel centres, as torch does without align_corners; without
    # antialiasing a smaller output reads the same taps too. torch's nearest (floor(dst * in/out)) is
    # not jax's (round-half-up of the centre) unless the output is an integer multiple of the input.
    align, scales = (rest[0], rest[1]) if node.target is aten.upsample_bilinear2d.vec else (False, rest[0])
    sizes = node.args[0].meta["val"].shape[-2:]
    out = tuple(node.meta["val"].shape[-2:])
    if align or scales is not None or not all(isinstance(n, int) for n in (*sizes, *out)):
        raise KeyError("upsampling with align_corners or scale factors")
    method = "bilinear"
    if node.target is aten.upsample_nearest2d.vec:
        if any(o % n for o, n in zip(out, sizes)):
            raise KeyError("nearest upsampling to a size that is not a multiple of the input's")
        method = "nearest"
    return f"jax.image.resize({lit(x)}, {lit(x)}.shape[:2] + {lit(out)}, {method!r}, antialias=False)"


@rule(aten.native_group_norm.default, parts=(0,))
def _group_norm(x: Any, w: Any, b: Any, n: Any, c: Any, hw: Any, groups: int, eps: float) -> str:
    return f"group_norm({lit(x)}, {groups}, {lit(w)}, {lit(b)}, {eps!r})"


# Module-level functions of the emitted file, written into it where its code calls them (`name(`):
# torch ops whose jnp form is several statements.
HELPERS = {
    "trim_padded": '''def trim_padded(value, lengths):
    """A padded result cut to its lengths: the exact result, as the converted model's call returns it
    (read on the host, so a caller under jax.jit takes the padded value and lengths instead)."""
    return value[tuple(slice(0, int(n)) for n in np.asarray(lengths))]''',
    "group_norm": '''def group_norm(x, groups, scale, bias, eps):
    """torch's GroupNorm on (N, C, ...): each sample's channels in `groups` groups, normalised over the group."""
    g = x.reshape(x.shape[0], groups, -1)
    g = (g - g.mean(axis=2, keepdims=True)) * jax.lax.rsqrt(g.var(axis=2, keepdims=True) + eps)
    out = g.reshape(x.shape)
    column = (-1,) + (1,) * (x.ndim - 2)
    out = out if scale is None else out * scale.reshape(column)
    return out if bias is None else out + bias.reshape(column)''',
    "adaptive_avg_pool2d": '''def adaptive_avg_pool2d(x, size):
    """torch's adaptive average pooling of NCHW: output row i averages input rows
    [floor(i * H / out), ceil((i + 1) * H / out)), likewise the columns (bins may overlap)."""
    for axis, out in zip((2, 3), size):
        n = x.shape[axis]
        bins = [jax.lax.slice_in_dim(x, i * n // out, -(-(i + 1) * n // out), axis=axis) for i in range(out)]
        x = jnp.stack([b.mean(axis=axis) for b in bins], axis=axis)
    return x''',
}


@rule(aten.sort.default, named=True)
def _sort(a: Any, dim: int = -1, descending: bool = False) -> tuple[str, str]:
    # a stable sort, as the converted model's (ties keep their order; NaN sorts as the largest)
    flags = f"axis={dim}" + (", descending=True" if descending else "")
    return f"jnp.sort({lit(a)}, {flags})", f"jnp.argsort({lit(a)}, {flags}, stable=True)"


@rule(aten.slice_scatter.default, node=True)
def _slice_scatter(a: Any, src: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1,
                   node: Any = None) -> str:
    window = _slice(Expr(""), dim, start, end, step, node=node)  # `[:, 0:n]`: the slice's own text
    return f"{lit(a)}.at{window}.set({lit(src)})"


@rule(aten.select_scatter.default, node=True)
def _select_scatter(a: Any, src: Any, dim: int, index: Any, node: Any) -> str:
    return f"{lit(a)}.at{_select(Expr(''), dim, index, node)}.set({lit(src)})"
