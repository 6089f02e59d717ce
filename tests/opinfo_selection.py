"""The wide OpInfo selection the 97% coverage goal is measured on (`scripts/op_coverage.py --selection`)."""
from __future__ import annotations

from typing import Any

# The selection: every OpInfo entry whose name or module is torch.nn.functional or linalg,
# or that is an elementwise, reduction/scan, indexing, shape or sorting op of torch's own
# namespace. Precisely, an entry is selected when any of these holds:
#   nn.functional  its name starts with "nn.functional."
#   linalg         it is defined in OpInfo's linalg module, its name starts with "linalg.",
#                  or it is one of the torch-level matrix functions in _LINALG
#   elementwise    it is a UnaryUfuncInfo / BinaryUfuncInfo of torch's namespace (those of
#                  the torch.special module are that module's, not torch's), or in _ELEMENTWISE
#   reduction      it is a ReductionOpInfo outside the masked module, or in _REDUCTION
#   indexing / shape / sorting   in _INDEXING / _SHAPE (or a ShapeFuncInfo) / _SORTING
# Two exclusion classes: _RANDOM, ops that sample random numbers, whose values no JAX
# program can reproduce (they belong to the training-mode conversion); _CUDA_ONLY, entries
# torch itself runs only on CUDA (eager torch fails on the CPU, so nothing can be compared).
# Entries of other modules (torch.special, fft, signal, masked, sparse) and other CUDA
# kernels (_scaled_mm, flash/efficient attention) are not in the selection because none of
# the rules above names them.
_LINALG = """
    addmm addmm:decomposed addmv addbmm baddbmm addr dot vdot bmm mv mm matmul __rmatmul__
    outer inner kron tensordot einsum block_diag cross cdist dist trace
    cholesky cholesky_inverse cholesky_solve logdet svd lu lu_solve lu_unpack qr
    geqrf ormqr triangular_solve pinverse matrix_exp norm norm:nuc norm:fro norm:inf renorm
    corrcoef cov
"""
_ELEMENTWISE = """
    addcmul addcdiv clamp lerp where logaddexp2 nan_to_num masked_fill allclose equal
    resolve_conj resolve_neg view_as_real view_as_complex to
"""
_REDUCTION = """
    cumsum cumprod cummax cummin logcumsumexp logsumexp max:reduction_with_dim
    max:reduction_no_dim min:reduction_with_dim min:reduction_no_dim aminmax median nanmedian
    mode var_mean var_mean:unbiased std_mean std_mean:unbiased quantile nanquantile softmax
    softmax:with_dtype log_softmax log_softmax:with_dtype diff gradient trapz trapezoid
    cumulative_trapezoid histc histogram bincount
"""
_INDEXING = """
    __getitem__ index_put index_select index_add index_copy index_fill index_reduce:mean
    index_reduce:prod index_reduce:amin index_reduce:amax gather scatter scatter_add
    scatter_reduce:sum scatter_reduce:prod scatter_reduce:mean scatter_reduce:amin
    scatter_reduce:amax take take_along_dim put masked_scatter masked_select nonzero
    nonzero_static argwhere select_scatter slice_scatter diagonal_scatter as_strided_scatter
    isin unravel_index tril_indices triu_indices
"""
_SHAPE = """
    broadcast_to broadcast_shapes broadcast_tensors chunk unsafe_chunk clone contiguous
    sum_to_size expand expand_as expand_copy diag diag_embed diagflat diagonal diagonal_copy
    alias_copy flip fliplr flipud rot90 roll meshgrid:variadic_tensors meshgrid:list_of_tensors
    as_strided as_strided:partial_views as_strided_copy narrow narrow_copy view_copy permute
    permute_copy split split:list_args unsafe_split split_with_sizes split_with_sizes_copy
    select slice tensor_split hsplit vsplit dsplit ravel reshape reshape_as view view_as
    atleast_1d atleast_2d atleast_3d flatten unflatten column_stack stack hstack vstack dstack
    cat _chunk_cat unbind unbind_copy unfold unfold_copy movedim squeeze squeeze:multiple
    squeeze_copy unsqueeze unsqueeze_copy transpose transpose_copy t t_copy T H mT mH tril
    triu constant_pad_nd repeat_interleave combinations cartesian_prod
"""
_SORTING = "sort argsort msort topk kthvalue unique unique_consecutive searchsorted bucketize"
_RANDOM = """
    bernoulli cauchy exponential geometric log_normal multinomial normal normal:in_place
    normal:number_mean uniform rand_like randint randint_like randn randn_like
    nn.functional.dropout nn.functional.dropout2d nn.functional.dropout3d
    nn.functional.alpha_dropout nn.functional.feature_alpha_dropout:with_train
    nn.functional.rrelu nn.functional.fractional_max_pool2d nn.functional.fractional_max_pool3d
    svd_lowrank pca_lowrank
"""

_CUDA_ONLY = "jiterator_unary jiterator_binary jiterator_binary_return_by_ref nn.functional.batch_norm:without_cudnn"


def _keys(text: str) -> set[tuple[str, str]]:
    return {(w.partition(":")[0], w.partition(":")[2]) for w in text.split()}


LISTED = {
    "linalg": _keys(_LINALG), "elementwise": _keys(_ELEMENTWISE), "reduction": _keys(_REDUCTION),
    "indexing": _keys(_INDEXING), "shape": _keys(_SHAPE), "sorting": _keys(_SORTING),
}
RANDOM = _keys(_RANDOM)
CUDA_ONLY = _keys(_CUDA_ONLY)


def _module_keys(module: str) -> set[tuple[str, str]]:
    from torch.testing._internal.opinfo import definitions

    return {(o.name, o.variant_test_name) for o in getattr(definitions, module).op_db}


def classify(db: dict[tuple[str, str], Any]) -> dict[tuple[str, str], str]:
    """The selected entries of `db` with their class; excluded ones map to "random" or "cuda only"."""
    from torch.testing._internal.opinfo.core import BinaryUfuncInfo, ReductionOpInfo, ShapeFuncInfo, UnaryUfuncInfo

    other_modules = _module_keys("special") | _module_keys("_masked")
    linalg_module = _module_keys("linalg")
    out: dict[tuple[str, str], str] = {}
    for key, info in db.items():
        name = key[0]
        if key in RANDOM:
            cls = "random"
        elif key in CUDA_ONLY:
            cls = "cuda only"
        elif name.startswith("nn.functional."):
            cls = "nn.functional"
        elif key in linalg_module or name.startswith("linalg.") or key in LISTED["linalg"]:
            cls = "linalg"
        elif isinstance(info, (UnaryUfuncInfo, BinaryUfuncInfo)) and key not in other_modules:
            cls = "elementwise"
        elif isinstance(info, ReductionOpInfo) and key not in other_modules:
            cls = "reduction"
        elif isinstance(info, ShapeFuncInfo):
            cls = "shape"
        else:
            cls = next((c for c, keys in LISTED.items() if key in keys), "")
        if cls:
            out[key] = cls
    return out


def selection(db: dict[tuple[str, str], Any]) -> list[tuple[str, str]]:
    """The measured entries: selected and not excluded, in a stable order."""
    return sorted(k for k, c in classify(db).items() if c not in ("random", "cuda only"))
