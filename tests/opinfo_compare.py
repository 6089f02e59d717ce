"""How OpInfo results are judged: torch vs JAX leaf comparison and the int64 policy checks."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from dycl_jax.lower.dtypes import INT32_MAX, INT32_MIN, to_jax_dtype

RTOL, ATOL = 1e-4, 1e-5  # float32 (and float64, held as float32) results
# Half precision: torch computes in the same dtype, and so do we, so both results carry the
# dtype's rounding. Each side rounds once per op, but composite ops (means, norms, softmax,
# matmul/conv accumulation) round their parts in different orders, so the two may be a few
# units in the last place apart: allowed 4 eps of the dtype relative (float16 eps 2**-10,
# bfloat16 2**-7; 4 to 8 ulps), and 4 eps absolute near zero, where results come from the
# cancellation of O(1) inputs. Integer and bool results must match exactly.
HALF_TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (4 * 2.0**-10, 4 * 2.0**-10),
    torch.bfloat16: (4 * 2.0**-7, 4 * 2.0**-7),
}


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for a floating result of torch dtype `dtype`."""
    return HALF_TOLERANCE.get(dtype, (RTOL, ATOL))


def outside_int32(leaves: list[Any]) -> bool:
    """Whether a sample carries integers dycl_jax cannot hold (the int64 policy says: raise)."""
    for v in leaves:
        if isinstance(v, torch.Tensor) and v.dtype == torch.int64 and v.numel():
            if int(v.min()) < INT32_MIN or int(v.max()) > INT32_MAX:
                return True
        elif isinstance(v, int) and not isinstance(v, bool) and not INT32_MIN <= v <= INT32_MAX:
            return True
    return False


def compare(expected: Any, got: Any) -> str | None:
    """None when `got` (JAX) matches `expected` (torch) leaf by leaf; else what differs. A
    torch.Size (a tuple subclass with no JAX counterpart) is compared as the tuple it is."""
    expected = pytree.tree_map_only(torch.Size, tuple, expected, is_leaf=lambda v: isinstance(v, torch.Size))
    exp_leaves, exp_spec = pytree.tree_flatten(expected)
    got_leaves, got_spec = pytree.tree_flatten(got)
    if exp_spec != got_spec:
        return f"output structure {got_spec} != torch's {exp_spec}"
    for i, (e, g) in enumerate(zip(exp_leaves, got_leaves)):
        e_t = e if isinstance(e, torch.Tensor) else torch.tensor(e)
        g_np = np.asarray(g)
        want_dtype = to_jax_dtype(e_t.dtype)
        # int64 / float64 are held as int32 / float32 unless the program runs with 64-bit types
        # (lower/int_ranges.py): then they match torch's dtype exactly
        exact = {torch.int64: np.int64, torch.float64: np.float64}.get(e_t.dtype)
        if g_np.dtype != want_dtype and g_np.dtype != exact:
            return f"leaf {i}: dtype {g_np.dtype} != {want_dtype} (torch {e_t.dtype})"
        if tuple(g_np.shape) != tuple(e_t.shape):
            return f"leaf {i}: shape {tuple(g_np.shape)} != torch's {tuple(e_t.shape)}"
        e_d = e_t.detach().resolve_conj().resolve_neg()
        e_np = (e_d.float() if e_d.dtype == torch.bfloat16 else e_d).numpy()  # numpy has no bfloat16
        if e_t.is_floating_point() or e_t.is_complex():
            e_np = e_np.astype(g_np.dtype)  # float64 results are held as float32 (policy)
            rtol, atol = tolerance(e_t.dtype)
            wide = np.complex128 if e_t.is_complex() else np.float64  # no overflow in the difference
            ok = np.isclose(g_np.astype(wide), e_np.astype(wide), rtol=rtol, atol=atol, equal_nan=True)
            if not ok.all():
                bad = np.argwhere(~ok)[0]
                where = tuple(int(b) for b in bad)
                return (
                    f"leaf {i}: {int((~ok).sum())}/{ok.size} values differ, e.g. at {where}: "
                    f"{g_np[where]!r} vs torch {e_np[where]!r}"
                )
        elif not np.array_equal(g_np, e_np):  # by value: an int64 result wrapped to int32 must not match
            return f"leaf {i}: integer/bool values differ ({int((g_np != e_np).sum())} of {g_np.size})"
    return None


def identical(a: Any, b: Any) -> bool:
    """Whether two eager torch results are the same, NaNs included."""
    la, sa = pytree.tree_flatten(a)
    lb, sb = pytree.tree_flatten(b)
    if sa != sb:
        return False
    for x, y in zip(la, lb):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.dtype == torch.complex32:  # torch has no nan_to_num or equal for it
                x, y = x.to(torch.complex64), y.to(torch.complex64)
            if x.is_floating_point() or x.is_complex():
                if not torch.equal(x.isnan(), y.isnan()):
                    return False
                x, y = x.nan_to_num(), y.nan_to_num()
            if not torch.equal(x, y):
                return False
        elif x != y and not (x != x and y != y):  # NaN != NaN for Python floats too
            return False
    return True


# Ops whose index outputs torch leaves unspecified among equal values (its CPU sort is not
# stable; topk's ties): name -> position of `dim` among the sample's args (else kwarg, else -1).
# Their indices are judged by what they select from the input, and sort's must be a permutation.
TIE_ORDER_FREE = {"sort": 0, "argsort": 0, "topk": 1}


# Ops whose eigenvector output torch defines only up to the sign of each vector (its phase, for
# complex ones): torch's docs say so, and its own float32 and float64 results (MKL's syevd)
# differ in sign. name -> position of the eigenvector leaf. Each column of the result is turned
# to torch's sign before the comparison, so it must still be the same vector.
SIGN_FREE = {"linalg.eigh": 1}


def align_signs(name: str, expected: Any, got: Any) -> Any:
    """`got` with each eigenvector (column) multiplied by the unit factor that best aligns it
    with torch's; the vectors themselves are not changed otherwise."""
    leaves, spec = pytree.tree_flatten(got)
    exp_leaves, _ = pytree.tree_flatten(expected)
    pos = SIGN_FREE[name]
    if len(leaves) <= pos or not isinstance(exp_leaves[pos], torch.Tensor):
        return got
    g = np.asarray(leaves[pos])
    e = exp_leaves[pos].detach().resolve_conj().numpy()
    if g.shape != e.shape or g.size == 0:
        return got
    inner = (np.conj(g.astype(np.complex128)) * e).sum(-2, keepdims=True)  # per column
    factor = np.where(np.abs(inner) > 0, inner / np.where(np.abs(inner) > 0, np.abs(inner), 1), 1)
    aligned = g * (factor.real if not np.iscomplexobj(g) else factor)
    leaves[pos] = aligned.astype(g.dtype)
    return pytree.tree_unflatten(leaves, spec)


def compare_tie_free(name: str, sample_input: torch.Tensor, args: tuple, kwargs: dict,
                     expected: Any, got: Any) -> str | None:
    """compare(), with integer (index) leaves replaced by the input values they select."""
    pos = TIE_ORDER_FREE[name]
    dim = kwargs.get("dim", args[pos] if len(args) > pos else -1)
    exp_leaves, spec = pytree.tree_flatten(expected)
    got_leaves, got_spec = pytree.tree_flatten(got)
    if spec != got_spec:
        return f"output structure {got_spec} != torch's {spec}"
    exp_out, got_out = [], []
    for i, (e, g) in enumerate(zip(exp_leaves, got_leaves)):
        g_np = np.asarray(g)
        if e.dtype != torch.int64 or sample_input.dim() == 0:
            exp_out.append(e)
            got_out.append(g)
            continue
        if g_np.dtype not in (np.int32, np.int64) or g_np.shape != tuple(e.shape):
            return f"leaf {i}: indices of dtype {g_np.dtype} and shape {g_np.shape} (torch {e.dtype}, {tuple(e.shape)})"
        idx = torch.from_numpy(g_np.astype(np.int64))
        if name != "topk" and not torch.equal(idx.sort(dim).values, e.sort(dim).values):
            return f"leaf {i}: the indices are not a permutation along dim {dim}"
        picked = torch.take_along_dim(sample_input, idx, dim)
        exp_out.append(torch.take_along_dim(sample_input, e, dim))
        as_np = picked.float().numpy() if picked.dtype == torch.bfloat16 else picked.numpy()
        got_out.append(as_np.astype(to_jax_dtype(picked.dtype)))
    return compare(pytree.tree_unflatten(exp_out, spec), pytree.tree_unflatten(got_out, spec))


# A float result that misses torch's by more than the tolerance is still right when it is no
# further from the op computed in the next wider dtype than torch's own result is (plus the
# tolerance): both are roundings of one exact value, and where a result comes from the
# cancellation of large terms (a sum of products, a matrix exponential's squarings) the two
# roundings may differ by more than a few eps of the small result.
WIDER: dict[torch.dtype, torch.dtype] = {
    torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.float32: torch.float64,
}


def no_less_accurate(expected: Any, reference: Any, got: Any) -> str | None:
    """None if every float leaf of `got` is no further from `reference` (torch on the same inputs
    in WIDER dtypes) than torch's `expected` is, plus the tolerance; other leaves must compare()
    equal to `expected`."""
    exp_leaves, spec = pytree.tree_flatten(expected)
    ref_leaves, _ = pytree.tree_flatten(reference)
    got_leaves, got_spec = pytree.tree_flatten(got)
    if spec != got_spec or len(ref_leaves) != len(exp_leaves):
        return f"output structure {got_spec} != torch's {spec}"
    for i, (e, r, g) in enumerate(zip(exp_leaves, ref_leaves, got_leaves)):
        if not (isinstance(e, torch.Tensor) and e.dtype in WIDER and isinstance(r, torch.Tensor)):
            problem = compare(e, g)
            if problem:
                return f"leaf {i}: {problem}"
            continue
        if np.asarray(g).dtype != to_jax_dtype(e.dtype) or tuple(np.shape(g)) != tuple(e.shape):
            return f"leaf {i}: {compare(e, g)}"
        rtol, atol = tolerance(e.dtype)
        e64, r64 = e.double().numpy(), r.double().numpy()
        g64 = np.asarray(g).astype(np.float64)
        ok = np.abs(g64 - r64) <= np.abs(e64 - r64) + atol + rtol * np.abs(r64)
        ok |= np.isnan(g64) & np.isnan(e64)
        ok |= (g64 == e64)  # the same infinity
        if not ok.all():
            where = tuple(int(b) for b in np.argwhere(~ok)[0])
            return f"leaf {i}: {g64[where]!r} is further from {r.dtype}'s {r64[where]!r} than torch's {e64[where]!r}"
    return None
