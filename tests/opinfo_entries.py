"""The OpInfo entries "that ordinary models use": the list the 90% coverage goal is measured on."""
from __future__ import annotations

# Why these: they are the functions that the layers of torch.nn and the code of common
# architectures (CNNs such as ResNet/MobileNet/U-Net, Transformers/ViT/BERT/GPT, RNN-free
# sequence models, MLPs, and the early-exit / layer-skipping / decode-loop networks dycl_jax
# targets) call in forward(): elementwise math, activations, normalisation, convolution and
# pooling, attention, matrix products, reductions used for pooling/halting/confidence,
# shape manipulation, indexing and the tensor creation done inside forward().
# Left out on purpose: random ops (dropout in training mode, bernoulli, rand*): no value to
# compare; in-place and `out=` variants (converted models are pure); linalg decompositions,
# FFT, special functions and signal windows (scientific code, not model layers); ops whose
# output shape depends on values (nonzero, unique, masked_select): XLA needs static shapes;
# losses other than the common ones; entries whose OpInfo has no float32 samples (integer-only
# bitwise ops, one_hot); rarer math (inverse hyperbolics, erfinv, hypot, copysign, ...) and
# near-duplicates (true_divide, ravel, atleast_*, upsample_*) that add runtime, not coverage.
# Format: "name" or "name:variant_test_name", separated by whitespace, grouped by family.
_GROUPS = {
    "elementwise unary": """
        abs acos asin atan ceil cos cosh erf erfc exp expm1 floor log log10 log1p log2
        nan_to_num neg reciprocal round rsqrt sigmoid sign sin sinh sqrt square tan tanh trunc
        isnan isinf isfinite logical_not
    """,
    "elementwise binary / ternary": """
        add sub rsub mul div:no_rounding_mode div:floor_rounding div:trunc_rounding
        floor_divide remainder fmod pow maximum minimum atan2 logaddexp eq ne lt le gt ge
        logical_and logical_or where lerp addcmul addcdiv clamp clamp_min clamp_max
    """,
    "activations": """
        nn.functional.relu nn.functional.relu6 nn.functional.gelu nn.functional.silu
        nn.functional.elu nn.functional.selu nn.functional.celu nn.functional.leaky_relu
        nn.functional.hardtanh nn.functional.hardsigmoid nn.functional.hardswish
        nn.functional.mish nn.functional.softplus nn.functional.softsign
        nn.functional.logsigmoid nn.functional.glu nn.functional.prelu nn.functional.threshold
        nn.functional.hardshrink nn.functional.softshrink nn.functional.tanhshrink
    """,
    "softmax family": """
        softmax softmax:with_dtype log_softmax log_softmax:with_dtype nn.functional.softmin
        logsumexp
    """,
    "reductions and scans": """
        sum mean prod amax amin max:reduction_no_dim max:reduction_with_dim max:binary
        min:reduction_no_dim min:reduction_with_dim min:binary argmax argmin all any std
        std:unbiased var var:unbiased var_mean std_mean norm linalg.vector_norm cumsum cumprod
    """,
    "sorting and selection": "sort argsort topk",
    "matrix products": """
        matmul mm bmm addmm addmm:decomposed baddbmm dot outer einsum tensordot
        nn.functional.linear nn.functional.bilinear
    """,
    "convolution, pooling, resampling": """
        nn.functional.conv1d nn.functional.conv2d nn.functional.conv_transpose1d
        nn.functional.conv_transpose2d nn.functional.max_pool1d nn.functional.max_pool2d
        nn.functional.avg_pool1d nn.functional.avg_pool2d nn.functional.adaptive_avg_pool1d
        nn.functional.adaptive_avg_pool2d nn.functional.adaptive_max_pool2d
        nn.functional.pixel_shuffle nn.functional.pixel_unshuffle nn.functional.unfold
        nn.functional.interpolate:nearest nn.functional.interpolate:nearest-exact
        nn.functional.interpolate:linear nn.functional.interpolate:bilinear
        nn.functional.interpolate:bicubic nn.functional.interpolate:area nn.functional.grid_sample
    """,
    "normalisation": """
        nn.functional.batch_norm nn.functional.layer_norm nn.functional.group_norm
        nn.functional.instance_norm nn.functional.rms_norm nn.functional.normalize
    """,
    "embedding and attention": """
        nn.functional.embedding nn.functional.embedding_bag nn.functional.scaled_dot_product_attention
        nn.functional.cosine_similarity nn.functional.pairwise_distance nn.functional.pdist
    """,
    "common losses": """
        nn.functional.cross_entropy nn.functional.nll_loss nn.functional.mse_loss
        nn.functional.l1_loss nn.functional.smooth_l1_loss nn.functional.binary_cross_entropy
        nn.functional.binary_cross_entropy_with_logits nn.functional.ctc_loss
    """,
    "shape and layout": """
        cat stack hstack vstack reshape reshape_as view view_as permute transpose t movedim
        squeeze squeeze:multiple unsqueeze expand expand_as broadcast_to broadcast_tensors
        flatten unflatten split split:list_args split_with_sizes chunk tensor_split unbind
        narrow select slice flip fliplr flipud roll repeat tile repeat_interleave contiguous
        clone tril triu diagonal diag_embed meshgrid:variadic_tensors
        nn.functional.pad:constant nn.functional.pad:reflect nn.functional.pad:replicate
        nn.functional.pad:circular constant_pad_nd __getitem__ unfold
    """,
    "indexing and scatter/gather": """
        index_select gather scatter scatter_add scatter_reduce:sum scatter_reduce:amax
        scatter_reduce:amin index_put index_add index_copy index_fill masked_fill take_along_dim
        select_scatter slice_scatter
    """,
    "creation and conversion": """
        arange linspace zeros_like ones_like full_like new_zeros new_ones new_full zeros ones
        full eye scalar_tensor float double bool long to
    """,
}


def _parse(text: str) -> list[tuple[str, str]]:
    out = []
    for word in text.split():
        name, _, variant = word.partition(":")
        out.append((name, variant))
    return out


GROUPS: dict[str, list[tuple[str, str]]] = {g: _parse(t) for g, t in _GROUPS.items()}
ORDINARY: list[tuple[str, str]] = [k for keys in GROUPS.values() for k in keys]
GROUP_OF: dict[tuple[str, str], str] = {k: g for g, keys in GROUPS.items() for k in keys}

# Samples that found a lowering bug (or show a listed limit), run by CI beyond the first
# samples of each dtype: (name, variant, dtype name) -> indices as opinfo_support.samples_of
# numbers them (seeded per entry and dtype, so the same sample every run).
REGRESSION_SAMPLES: dict[tuple[str, str, str], tuple[int, ...]] = {
    ("div", "trunc_rounding", "float16"): (6, 7),  # XLA's float16 division 1 ulp off before trunc
    ("softmax", "", "float32"): (6,),  # a 0-d input
    ("log_softmax", "", "float16"): (6,),  # a 0-d input
    ("nn.functional.group_norm", "", "bfloat16"): (12,),  # an empty batch
    ("nn.functional.embedding_bag", "", "bfloat16"): (1,),  # weighted sum: torch accumulates in float32
    # integer results from float bounds: torch's kernel truncates the bounds first
    ("linspace", "", "int32"): (32,),
    ("linspace", "", "int64"): (44,),
    ("arange", "", "int32"): (14, 15),
    ("arange", "", "int64"): (10, 22),  # its length from the truncated bounds
    ("arange", "", "float32"): (6,),  # bool bounds
    # the one sample without running statistics (REGRESSION_ONLY)
    ("nn.functional.instance_norm", "", "float32"): (8,),
    ("nn.functional.instance_norm", "", "float16"): (8,),
    ("nn.functional.instance_norm", "", "bfloat16"): (8,),
}

# Entries whose other samples cannot be compared by design (they update the caller's tensors
# in place, which converted models refuse; tests/test_input_mutation.py checks the refusal):
# CI runs only their REGRESSION_SAMPLES, each conversion of the others costs seconds and checks nothing.
REGRESSION_ONLY: frozenset[tuple[str, str]] = frozenset({("nn.functional.instance_norm", "")})
