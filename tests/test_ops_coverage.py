"""Lowerings that models need beyond the basics (grid_sample, embedding_bag, pdist, det/slogdet,
SVD norms, triangular solves, complex views, ctc_loss, multi-head attention), against torch in
every argument form, with gradients against torch autograd where models train through them."""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import dycl_jax
from differential import assert_same

TOL = 1e-4  # float32 outputs and gradients (rtol and atol)


class Fn(torch.nn.Module):
    """forward(*args) = fn(*args): one module per checked program; `modules` become submodules
    (their parameters and buffers the converted state) for fn to close over."""

    def __init__(self, fn, **modules):
        super().__init__()
        self.fn = fn
        for name, m in modules.items():
            self.add_module(name, m)

    def forward(self, *args):
        return self.fn(*args)


def _float_leaves(out) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def check(module: torch.nn.Module, *args, grad: tuple[int, ...] | None = None, tol: float = TOL, host: str = "auto",
          grad_leaves: tuple[int, ...] | None = None):
    """Convert, compare the outputs with torch; with `grad`, also the gradients of a random
    projection of the float outputs (of those listed in `grad_leaves`, else all) with respect
    to those arguments and to the parameters (`grad=()`: the parameters only)."""
    module = module.eval()
    jm = dycl_jax.to_jax(module, args, dynamic_batch=False, host=host)
    with torch.no_grad():
        want = module(*args)
    assert_same(want, jm(*args), type(module).__name__, rtol=tol, atol=tol)
    # a statement run by torch on the dispatch host would match torch without testing a lowering
    assert not jm.report().host_statements, jm.report().host_statements
    if grad is not None:
        _check_grad(module, jm, args, grad, tol, grad_leaves)
    return jm


def _check_grad(module, jm, args, grad, tol, leaves=None) -> None:
    from flax import nnx

    targs = [a.detach().clone().requires_grad_(i in grad) if isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]
    module.zero_grad()
    outs = _pick(_float_leaves(module(*targs)), leaves)
    gen = torch.Generator().manual_seed(3)
    projs = [torch.randn(o.shape, generator=gen) for o in outs]
    sum((o * p).sum() for o, p in zip(outs, projs)).backward()
    want = [targs[i].grad for i in grad]
    want_params = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}

    params, rest = nnx.state(jm.module, nnx.Param, ...)
    np_args = [a.numpy() if isinstance(a, torch.Tensor) else a for a in args]
    jprojs = [p.numpy() for p in projs]

    def loss(p, xs):
        call = list(np_args)
        for i, x in zip(grad, xs):
            call[i] = x
        outs = [o for o in jax.tree_util.tree_leaves(jm.apply(nnx.merge_state(p, rest), *call))
                if np.issubdtype(o.dtype, np.floating)]
        return sum((o * q).sum() for o, q in zip(_pick(outs, leaves), jprojs))

    g_params, g_args = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, [np_args[i] for i in grad])
    for i, g, w in zip(grad, g_args, want):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=tol, atol=tol, err_msg=f"gradient of argument {i}")
    got_params = {".".join(map(str, k)): np.asarray(v.value) for k, v in g_params.flat_state()}
    for name, w in want_params.items():
        np.testing.assert_allclose(got_params[name], w.numpy(), rtol=tol, atol=tol, err_msg=f"gradient of {name}")


def _pick(items: list, indices: tuple[int, ...] | None) -> list:
    return items if indices is None else [items[i] for i in indices]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------ grid_sample / affine_grid

_MODES_2D = [(m, p, a) for m in ("bilinear", "nearest", "bicubic") for p in ("zeros", "border", "reflection")
             for a in (False, True)]


def _grid(shape, seed: int) -> torch.Tensor:
    # coordinates beyond [-1, 1] exercise the padding rule; a few sit exactly on pixel centres,
    # borders and half-way points (ties of nearest rounding)
    g = torch.rand(shape, generator=_gen(seed)) * 2.6 - 1.3
    g.view(-1)[:6] = torch.tensor([-1.0, 1.0, 0.0, 0.5, -0.25, 1.0])
    return g


# gradients (to the image and to the grid) for a subset: each mode and each padding rule once
# at least, both alignments; XLA's compile time of the gradient grows with every variant
_GRAD_2D = [("bilinear", "zeros", False), ("bilinear", "border", True), ("bilinear", "reflection", False),
            ("bicubic", "reflection", True), ("bicubic", "zeros", False), ("nearest", "border", False)]


def _sampler(forms):
    return Fn(lambda x, g: tuple(F.grid_sample(x, g, mode=m, padding_mode=p, align_corners=a) for m, p, a in forms))


def test_grid_sample_2d_every_mode_padding_and_alignment() -> None:
    x = torch.randn(2, 3, 5, 7, generator=_gen(0))
    g = _grid((2, 4, 6, 2), 1)
    check(_sampler(_MODES_2D), x, g, grad=(0, 1), grad_leaves=tuple(_MODES_2D.index(f) for f in _GRAD_2D))


def test_grid_sample_3d_and_affine_grid_spatial_transformer() -> None:
    x = torch.randn(1, 2, 3, 4, 5, generator=_gen(2))
    g = _grid((1, 2, 3, 4, 3), 3)
    forms = [f for f in _MODES_2D if f[0] != "bicubic"]
    check(_sampler(forms), x, g, grad=(0, 1),
          grad_leaves=(forms.index(("bilinear", "reflection", True)), forms.index(("bilinear", "border", False))))

    class SpatialTransformer(torch.nn.Module):
        """A localisation net predicts an affine map; the image is resampled through it."""

        def __init__(self):
            super().__init__()
            self.loc = torch.nn.Linear(3 * 8 * 8, 6)

        def forward(self, img):
            theta = self.loc(img.flatten(1)).view(-1, 2, 3) + torch.tensor([[1.0, 0, 0], [0, 1.0, 0]])
            grid = F.affine_grid(theta, list(img.shape), align_corners=False)
            return F.grid_sample(img, grid, align_corners=False)

    torch.manual_seed(0)
    check(SpatialTransformer(), torch.randn(2, 3, 8, 8, generator=_gen(4)), grad=(0,))


def test_deformable_sampling_offsets_from_data() -> None:
    """Deformable-convolution style: offsets predicted by a conv shift a base grid."""

    class Deform(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.offset = torch.nn.Conv2d(4, 2, 3, padding=1)

        def forward(self, x):
            n, _, h, w = x.shape
            ys, xs = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
            base = torch.stack([xs, ys], -1).expand(n, h, w, 2)
            grid = base + self.offset(x).permute(0, 2, 3, 1).tanh() * 0.5
            return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=True)

    torch.manual_seed(1)
    check(Deform(), torch.randn(2, 4, 6, 5, generator=_gen(5)), grad=(0,))


# ------------------------------------------------------------------ embedding_bag


def test_embedding_bag_modes_offsets_padding_and_weights() -> None:
    w = torch.randn(10, 4, generator=_gen(6))
    idx = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 4])
    off = torch.tensor([0, 3, 3, 6])  # the second bag is empty
    psw = torch.rand(10, generator=_gen(7))
    idx2d = torch.tensor([[1, 2, 4], [4, 3, 4]])

    def bags(w, idx, off, psw, idx2d):
        out = []
        for mode in ("sum", "mean", "max"):
            out.append(F.embedding_bag(idx, w, off, mode=mode))
            out.append(F.embedding_bag(idx, w, off, mode=mode, padding_idx=4))
            out.append(F.embedding_bag(idx2d, w, mode=mode))
            out.append(F.embedding_bag(idx, w, torch.cat([off, torch.tensor([10])]), mode=mode,
                                       include_last_offset=True))
        out.append(F.embedding_bag(idx, w, off, mode="sum", per_sample_weights=psw))
        out.append(F.embedding_bag(idx, w, off, mode="sum", per_sample_weights=psw, padding_idx=-1))
        return tuple(out)

    check(Fn(bags), w, idx, off, psw, idx2d, grad=(0, 3))


def test_embedding_bag_module_trains_like_torch() -> None:
    torch.manual_seed(2)
    bag = torch.nn.EmbeddingBag(12, 5, mode="mean", padding_idx=0)
    head = torch.nn.Linear(5, 2)
    model = torch.nn.ModuleDict({"bag": bag, "head": head})

    class TextClassifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, tokens, offsets):
            return self.m["head"](self.m["bag"](tokens, offsets))

    tokens = torch.tensor([3, 0, 7, 11, 2, 2, 5])
    check(TextClassifier(), tokens, torch.tensor([0, 2, 5]), grad=())


# ------------------------------------------------------------------ ctc_loss


def _ctc_case(seed: int, t: int = 12, n: int = 3, c: int = 6, s: int = 4):
    g = _gen(seed)
    log_probs = torch.randn(t, n, c, generator=g).log_softmax(-1)
    targets = torch.randint(1, c, (n, s), generator=g)
    targets[0, 1] = targets[0, 0]  # a repeated label needs a blank between the two
    input_lengths = torch.tensor([t, t - 3, 3])  # the last is too short for 4 labels: infinite loss
    target_lengths = torch.tensor([s, s - 1, s])
    return log_probs, targets, input_lengths, target_lengths


@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_loss_reductions_lengths_and_zero_infinity(zero_infinity: bool) -> None:
    lp, tg, il, tl = _ctc_case(8)
    flat = torch.cat([tg[i, :int(tl[i])] for i in range(len(tl))])  # concatenated 1-D targets

    def losses(lp, tg, il, tl, flat):
        out = [F.ctc_loss(lp, tg, il, tl, reduction=r, zero_infinity=zero_infinity) for r in ("none", "mean", "sum")]
        out.append(F.ctc_loss(lp, flat, il, tl, reduction="none", zero_infinity=zero_infinity))
        # lengths as Python lists (baked in: the IntList overload)
        out.append(F.ctc_loss(lp, tg, [12, 9, 3], [4, 3, 4], reduction="sum", zero_infinity=zero_infinity))
        # one unbatched sequence
        out.append(F.ctc_loss(lp[:, 1], tg[1, :3], il[1:2], tl[1:2], reduction="none", zero_infinity=zero_infinity))
        # the blank as the last class: labels 0..4
        out.append(F.ctc_loss(lp, tg - 1, il, tl, blank=5, reduction="none", zero_infinity=zero_infinity))
        return tuple(out)

    want = losses(lp, tg, il, tl, flat)
    assert torch.isinf(want[0][2]) != zero_infinity  # the infeasible sequence is in the sample
    check(Fn(losses), lp, tg, il, tl, flat)


# ------------------------------------------------------------------ multi-head attention


class _Attention(torch.nn.Module):
    """Every argument form of multi-head attention in one program (one conversion)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.plain = torch.nn.MultiheadAttention(8, 2)
        self.extras = torch.nn.MultiheadAttention(8, 2, add_bias_kv=True, add_zero_attn=True)
        self.cross = torch.nn.MultiheadAttention(8, 2, kdim=6, vdim=5)  # separate q/k/v projection weights
        self.first = torch.nn.MultiheadAttention(8, 4, batch_first=True, bias=False)

    def forward(self, q, k6, v5, kpm_bool, kpm_float, m2_bool, m2_float, m3_bool, m3_float, causal):
        out = [
            self.plain(q, q, q),  # need_weights, averaged weights
            self.plain(q, q, q, key_padding_mask=kpm_float, average_attn_weights=False),
            self.plain(q, q, q, attn_mask=m2_bool),
            self.plain(q, q, q, attn_mask=m2_float, need_weights=False)[0],
            self.plain(q, q, q, attn_mask=m3_bool, key_padding_mask=kpm_bool),
            self.plain(q, q, q, attn_mask=m3_float, need_weights=False)[0],
            self.plain(q, q, q, attn_mask=causal, is_causal=True, need_weights=False)[0],
            self.plain(q, q, q, attn_mask=causal, is_causal=True, key_padding_mask=kpm_bool),
            self.extras(q, q, q, key_padding_mask=kpm_bool),
            self.extras(q, q, q, attn_mask=m2_float, need_weights=False)[0],
            self.cross(q, k6, v5, key_padding_mask=kpm_bool, average_attn_weights=False),
            self.first(q.transpose(0, 1), q.transpose(0, 1), q.transpose(0, 1)),
            self.first(q.transpose(0, 1), q.transpose(0, 1), q.transpose(0, 1), attn_mask=m2_bool,
                       need_weights=False)[0],
        ]
        return tuple(out)


def _attention_inputs():
    g = _gen(9)
    length, batch = 5, 3
    q = torch.randn(length, batch, 8, generator=g)
    k6, v5 = torch.randn(length, batch, 6, generator=g), torch.randn(length, batch, 5, generator=g)
    kpm_bool = torch.zeros(batch, length, dtype=torch.bool)
    kpm_bool[0, 4], kpm_bool[1, 1:3] = True, True  # never a whole row: that would be NaN in torch too
    kpm_float = torch.where(kpm_bool, -1e4, 0.0) + torch.rand(batch, length, generator=g) * 0.1
    m2_bool = torch.rand(length, length, generator=g) > 0.7
    m2_bool.fill_diagonal_(False)
    m2_float = torch.randn(length, length, generator=g)
    m3_bool = (torch.rand(batch * 2, length, length, generator=g) > 0.7) & ~torch.eye(length, dtype=torch.bool)
    m3_float = torch.randn(batch * 2, length, length, generator=g)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(length)
    return q, k6, v5, kpm_bool, kpm_float, m2_bool, m2_float, m3_bool, m3_float, causal


def test_multi_head_attention_every_argument_form_and_gradients() -> None:
    # gradients (inputs and every projection weight) through float masks, bias_kv/zero_attn,
    # separate projections, batch_first and the causal SDPA path: the output and weight leaves
    # of forms 1, 4, 6, 8, 10 and 11
    check(_Attention(), *_attention_inputs(), grad=(0, 1, 2), grad_leaves=(2, 3, 7, 8, 10, 13, 14, 16, 17, 18, 19))


# ------------------------------------------------------------------ instance norm, pdist


def test_instance_norm_eval_forms() -> None:
    """Eval forms that update nothing in place: input statistics with or without affine
    parameters, and the running statistics (use_input_stats=False)."""
    torch.manual_seed(5)
    plain = torch.nn.InstanceNorm2d(3)
    affine = torch.nn.InstanceNorm1d(3, affine=True)
    tracked = torch.nn.InstanceNorm2d(3, track_running_stats=True)  # eval: uses the running stats
    tracked.running_mean.uniform_(-1, 1)
    tracked.running_var.uniform_(0.5, 2)
    with torch.no_grad():
        affine.weight.uniform_(0.5, 1.5)
        affine.bias.uniform_(-1, 1)
    mods = torch.nn.ModuleList([plain, affine, tracked])
    x2, x1 = torch.randn(2, 3, 4, 5, generator=_gen(10)) * 3 + 1, torch.randn(2, 3, 7, generator=_gen(11))
    check(Fn(lambda a, b: (mods[0](a), mods[1](b), mods[2](a), F.instance_norm(b, eps=1e-3)), mods=mods), x2, x1,
          grad=(0, 1))


def test_pdist_every_p_and_gradient() -> None:
    x = torch.randn(6, 4, generator=_gen(12))
    x[3] = x[1]  # a zero distance: torch's gradient there is 0, not NaN
    check(Fn(lambda x: tuple(F.pdist(x, p) for p in (2.0, 1.0, 0.5, 3.0, 0.0, float("inf")))), x)
    check(Fn(lambda x: (F.pdist(x), F.pdist(x, 3.0))), x, grad=(0,))


# ------------------------------------------------------------------ determinants, SVD norms, solves


def test_det_slogdet_logdet() -> None:
    a = torch.randn(3, 4, 4, generator=_gen(13))
    a[1] = a[1] @ a[1].mT + torch.eye(4)  # positive determinant
    a[2, :, 0] = -a[2, :, 0].abs() - 1  # likely negative: logdet is NaN there, as in torch
    check(Fn(lambda a: (torch.linalg.det(a), *torch.linalg.slogdet(a), torch.logdet(a), torch.det(a[0]))), a,
          grad=(0,))


def test_svd_based_norms() -> None:
    a = torch.randn(2, 4, 3, generator=_gen(14))

    def norms(a):
        out = [torch.linalg.matrix_norm(a, ord=o) for o in (2, -2, "nuc", "fro", 1, float("inf"))]
        out += [torch.linalg.svdvals(a), torch.linalg.norm(a, ord=2, dim=(1, 2)), torch.linalg.norm(a, ord=-2, dim=(1, 2)),
                torch.linalg.norm(a[0], ord="nuc"), torch.norm(a, p="nuc", dim=(1, 2)),
                torch.linalg.matrix_norm(a, ord=2, dim=(0, 2), keepdim=True), torch.linalg.cond(a[:, :3, :3])]
        return tuple(out)

    check(Fn(norms), a, grad=(0,))


def test_triangular_solves_every_form() -> None:
    g = _gen(15)
    a = torch.randn(2, 4, 4, generator=g) + 4 * torch.eye(4)  # well conditioned
    b = torch.randn(2, 4, 3, generator=g)
    bt = torch.randn(2, 3, 4, generator=g)

    def solves(a, b, bt):
        out = []
        for upper in (True, False):
            out.append(torch.linalg.solve_triangular(a.triu() if upper else a.tril(), b, upper=upper))
            out.append(torch.linalg.solve_triangular(a, bt, upper=upper, left=False))
            out.append(torch.linalg.solve_triangular(a, b, upper=upper, unitriangular=True))
            out.append(torch.linalg.solve_triangular(a[0], b, upper=upper))  # batch broadcast
            for transpose in (False, True):
                out.extend(torch.triangular_solve(b, a, upper=upper, transpose=transpose))
            out.append(torch.triangular_solve(b, a, upper=upper, unitriangular=True).solution)
        return tuple(out)

    check(Fn(solves), a, b, bt, grad=(0, 1))


def test_ldl_factor_and_solve_with_one_and_two_by_two_pivots() -> None:
    """ldl_solve on torch's factors; ldl_factor(_ex) bit for bit as torch's sytrf (LD, pivots,
    info) on indefinite, positive definite, singular and non-symmetric inputs (the lower
    triangle is read); one conversion for all of it."""
    g = torch.Generator().manual_seed(4)
    a = torch.randn(3, 5, 5, generator=g)
    sym = a + a.mT  # indefinite: Bunch-Kaufman pivoting picks 2x2 blocks for some of them
    ld, pivots = torch.linalg.ldl_factor(sym)
    assert (pivots < 0).any() and (pivots > 0).any(), pivots
    m = torch.randn(5, 7, 7, generator=g)
    mats = torch.stack([m[0] + m[0].T, m[1] @ m[1].T + torch.eye(7), m[2], m[3] + m[3].T, m[4] + m[4].T])
    mats[-1, :, 0] = mats[-1, 0, :] = 0  # a zero column: info 1, no elimination at that step

    def fn(ld, p, b, mats):
        factors = tuple(torch.linalg.ldl_factor_ex(mats)), tuple(torch.linalg.ldl_factor(mats[:-1]))
        return torch.linalg.ldl_solve(ld, p, b), *factors

    args = (ld, pivots, torch.randn(3, 5, 2, generator=g), mats)
    jm = check(Fn(fn), *args)
    _, (want_ld, want_piv, want_info), _ = fn(*args)
    assert (want_piv < 0).any() and want_info[-1] == 1, (want_piv, want_info)
    _, (got_ld, got_piv, got_info), (got_ld2, got_piv2) = jm(*args)
    np.testing.assert_array_equal(np.asarray(got_ld), want_ld.numpy())  # exact: the same pivots and roundings
    np.testing.assert_array_equal(np.asarray(got_ld2), want_ld[:-1].numpy())
    np.testing.assert_array_equal(np.asarray(got_piv), want_piv.numpy())
    np.testing.assert_array_equal(np.asarray(got_piv2), want_piv[:-1].numpy())
    np.testing.assert_array_equal(np.asarray(got_info), want_info.numpy())


def test_checked_linalg_functions_lower_without_the_error_check() -> None:
    """inv, solve, cholesky, lu_factor and what builds on them stage as one program (their
    error check is left out of the graph) and match torch on well-posed inputs."""
    g = _gen(18)
    a = torch.randn(2, 4, 4, generator=g) + 3 * torch.eye(4)
    b = torch.randn(2, 4, 2, generator=g)
    spd = a @ a.mT + torch.eye(4)
    jm = check(Fn(lambda a, b, spd: (torch.linalg.inv(a), torch.linalg.solve(a, b), torch.linalg.solve(a, b[..., 0]),
                                     torch.linalg.solve(a, b.mT, left=False), torch.linalg.cholesky(spd),
                                     torch.linalg.cholesky(spd, upper=True), torch.linalg.matrix_power(a, -2),
                                     *torch.linalg.lu_factor(a))), a, b, spd, grad=(0, 1, 2))
    assert jm.host == "staged"


def test_complex_views_inside_a_real_program_and_as_outputs() -> None:
    """Rotary-embedding style: pairs viewed as complex, rotated, viewed back as real. A complex
    output leaves the program as a complex64 array."""
    x = torch.randn(2, 5, 8, generator=_gen(16))
    angles = torch.rand(5, 4, generator=_gen(17)) * 6

    def rotary(x, angles):
        z = torch.view_as_complex(x.reshape(2, 5, 4, 2))
        rot = torch.polar(torch.ones_like(angles), angles)
        real = torch.view_as_real(z * rot).flatten(2)
        return real, (z * rot).abs(), torch.view_as_complex(x.reshape(2, 5, 4, 2).contiguous())

    jm = check(Fn(rotary), x, angles)
    out = jm(x.numpy(), angles.numpy())[2]
    assert out.dtype == np.complex64
    np.testing.assert_allclose(out, torch.view_as_complex(x.reshape(2, 5, 4, 2)).numpy(), rtol=1e-6)
    _check_grad(Fn(lambda x, a: rotary(x, a)[:2]), dycl_jax.to_jax(Fn(lambda x, a: rotary(x, a)[:2]), (x, angles),
                                                                  dynamic_batch=False), (x, angles), (0, 1), TOL)


def test_kthvalue_ties_matrix_exp_degrees_tensorinv_and_polygamma_poles() -> None:
    """Found by the wide selection: kthvalue's index among tied values is the one torch's
    quickselect leaves (NaN counted largest); matrix_exp picks torch's polynomial degree for a
    single matrix (norm below 0.58: degree 8) and scales and squares a batch; tensorinv inlines a
    checked inverse; polygamma(n >= 2) is +-inf at the poles 0, -1, ... and bfloat16 is computed
    in float32, as torch does; `put` accumulates bools as `or`; float16 renorm (a cast prim)."""
    ids = torch.tensor([[3, 1, 3, 0, 1, 3, 2, 1, 3], [2, 2, 2, 2, 0, 0, 5, 5, 2], [7, 7, 7, 7, 7, 7, 7, 7, 7]])
    scores = torch.tensor([[0.5, float("nan"), 0.5, -1.0, 0.5, 0.0, 0.5, float("nan"), 2.0]])
    gen = torch.Generator().manual_seed(0)
    one = torch.randn(3, 3, generator=gen) * 0.1
    batch = torch.randn(4, 3, 3, generator=gen) * 2
    t = torch.randn(6, 2, 3, generator=gen) + 3 * torch.eye(6).reshape(6, 2, 3)
    x = torch.tensor([0.0, -0.0, -1.0, -2.0, -2.5, 0.5, 3.0])

    def fn(ids, scores, one, batch, t, x):
        picks = [torch.kthvalue(ids, k, dim=1) for k in (3, 5)]
        picks.append(torch.kthvalue(ids, 2, dim=0, keepdim=True))
        picks.append(tuple(torch.kthvalue(scores, 8)))
        exps = torch.linalg.matrix_exp(one), torch.linalg.matrix_exp(batch)
        poly = [torch.polygamma(n, x) for n in (2, 3)] + [torch.polygamma(1, x.bfloat16() + 4)]
        flags = torch.put(ids > 2, torch.tensor([0, 0, -1, 4]), ids[0, :4] < 2, accumulate=True)
        return picks, exps, torch.linalg.tensorinv(t, ind=1), poly, flags, torch.renorm(batch.half(), 2, 0, 1.0)

    check(Fn(fn), ids, scores, one, batch, t, x)


# ------------------------------------------------------------------ the wide OpInfo selection


def test_wide_selection_names_real_entries_and_excludes_only_stated_classes() -> None:
    """Every name the selection lists is an OpInfo entry (a typo would silently shrink it), and
    the only entries left out of the measured list are the two stated exclusion classes."""
    from opinfo_selection import CUDA_ONLY, LISTED, RANDOM, classify, selection
    from opinfo_support import op_db

    db = op_db()
    for cls, keys in {**LISTED, "random": RANDOM, "cuda only": CUDA_ONLY}.items():
        missing = sorted(k for k in keys if k not in db)
        assert not missing, f"{cls}: not OpInfo entries: {missing}"
    classes = classify(db)
    measured = set(selection(db))
    assert {k for k, c in classes.items() if k not in measured} <= RANDOM | CUDA_ONLY
    assert ("nn.functional.grid_sample", "") in measured and ("linalg.svd", "") in measured
    assert ("special.i0e", "") not in measured and ("bernoulli", "") not in measured


def test_singular_matrices_give_torch_unchecked_values_and_info() -> None:
    """linalg.inv/solve/lu_factor of a singular matrix: no XLA program can raise as torch does, so
    the converted program returns the values of torch's unchecked `_ex` kernels (inf/NaN) and
    their `info` (the 1-based index of the first zero pivot), which the `_ex` forms expose;
    cholesky_ex's `info` is potrf's (the order of the first leading minor of the triangle it
    reads that is not positive definite) on positive definite, singular, indefinite and
    non-symmetric inputs."""
    a = torch.tensor([[[1.0, 2.0], [2.0, 4.0]], [[2.0, 0.0], [0.0, 3.0]], [[0.0, 0.0], [0.0, 1.0]]])
    b = torch.ones(3, 2, 1)
    c = torch.tensor([[[4.0, 2.0, 0.0], [2.0, 2.0, 0.0], [0.0, 0.0, 3.0]],  # positive definite
                      [[4.0, 2.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 3.0]],  # singular: minor 2
                      [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, -2.0]],  # indefinite: minor 3
                      [[1.0, 5.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],  # only its upper triangle fails
                      [[-1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])  # minor 1

    def unchecked(a, b, c):
        inv, inv_info = torch.linalg.inv_ex(a)
        _, solve_info = torch.linalg.solve_ex(a, b)
        *_, lu_info = torch.linalg.lu_factor_ex(a)
        low, low_info = torch.linalg.cholesky_ex(c)
        up, up_info = torch.linalg.cholesky_ex(c, upper=True)
        return inv, inv_info, solve_info, lu_info, low_info, up_info, low, up

    jm = dycl_jax.to_jax(Fn(lambda a, b, c: (*unchecked(a, b, c), torch.linalg.inv(a))), (a, b, c))
    want, got = unchecked(a, b, c), [np.asarray(g) for g in jm(a, b, c)]
    assert want[1].tolist() == [2, 0, 1] and want[4].tolist() == [0, 2, 3, 0, 1] and want[5].tolist() == [0, 2, 3, 2, 1]
    for w, g in zip(want[1:6], got[1:6]):
        np.testing.assert_array_equal(g, w.numpy())
    # the factors where they exist (torch leaves partial factors where `info` > 0, XLA NaNs)
    for k, ok in ((6, [0, 3]), (7, [0])):
        np.testing.assert_allclose(got[k][ok], want[k][ok].numpy(), rtol=1e-6)
    for inv in (got[0], got[8]):  # torch.linalg.inv raises on element 0; its unchecked values here
        np.testing.assert_allclose(inv[1:], want[0][1:].numpy(), rtol=1e-6)
        assert not np.isfinite(inv[0]).all() and not np.isfinite(want[0][0].numpy()).all()
