"""Torch and JAX side by side on example inputs: output agreement, and decision flips told apart
from real mismatches by the flipped predicate's margin (`dycl-jax convert`'s parity check)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from dycl_jax.errors import DyclError
from dycl_jax.report.record import DecisionFlip

# outputs within these agree (integers and bools: exactly); float16/bfloat16 have ~3 digits
_TOL = {2: 1e-2, 4: 1e-4, 8: 1e-4}
# floor of the observed float error: a few float32 ulps of a value of order one
FLOAT_ERROR_FLOOR = 1e-6


def _arr(v: Any) -> np.ndarray:
    import torch

    if not isinstance(v, torch.Tensor):
        return np.asarray(v)
    v = v.detach().cpu()
    return (v.float() if v.dtype == torch.bfloat16 else v).numpy()  # numpy has no bfloat16


def compare(torch_out: Any, jax_out: Any) -> dict[str, Any]:
    """Elementwise agreement of two output trees: float max-abs-diff, integer/bool exact matches,
    and `agree`: every float within tolerance (1e-4, 1e-2 in half precision), every integer equal."""
    import torch.utils._pytree as pytree

    t_leaves, j_leaves = pytree.tree_leaves(torch_out), pytree.tree_leaves(jax_out)
    res: dict[str, Any] = {"float": 0, "int": 0, "diff": 0.0, "match": 0, "total": 0, "problems": [], "agree": True}
    if len(t_leaves) != len(j_leaves):
        res["problems"].append(f"torch returned {len(t_leaves)} outputs, JAX {len(j_leaves)}")
    for i, (t, j) in enumerate(zip(t_leaves, j_leaves)):
        a, b = _arr(t), np.asarray(j)
        if a.shape != b.shape:
            res["problems"].append(f"output {i}: torch shape {list(a.shape)}, JAX shape {list(b.shape)}")
            continue
        if np.issubdtype(a.dtype, np.inexact) or np.issubdtype(b.dtype, np.inexact):
            res["float"] += 1
            if a.size:
                a64, b64 = a.astype(np.float64), b.astype(np.float64)
                diff = np.where(np.isnan(a64) & np.isnan(b64), 0.0, np.abs(a64 - b64))
                res["diff"] = max(res["diff"], float(np.nanmax(diff)))
                tol = _TOL.get(min(a.dtype.itemsize, b.dtype.itemsize), 1e-4)
                res["agree"] &= bool(np.all(diff <= tol + tol * np.abs(a64)))
        else:
            res["int"] += 1
            res["match"] += int((a == b).sum())
            res["total"] += a.size
            res["agree"] &= bool((a == b).all())
    res["agree"] &= not res["problems"]
    return res


def _torch_decisions(model: Any, method: str, args: tuple) -> list | None:
    """The rewritten torch program's decisions (None where the staged rewrite does not run it)."""
    from dycl_jax.rewrite.api import run_torch_trace

    try:
        return list(run_torch_trace(model, method, args)[1])
    except DyclError:
        return None


def classify(case: int, want: list | None, got: list, float_error: float) -> DecisionFlip:
    """A case whose outputs differ: a flip of a decision within `float_error` of its threshold
    (float rounding between torch and XLA), or a real mismatch.

    With torch's decisions (`want`), the first decision that differs is the flip, and its JAX
    margin decides. Without them (the dispatch host), the closest JAX decision stands in: the
    case counts as near-threshold only if some decision was within the float error."""
    if want is not None:
        k = next((i for i, (w, g) in enumerate(zip(want, got)) if tuple(w) != tuple(g)), None)
        if k is None and len(want) != len(got):
            k = min(len(want), len(got))
        if k is None:  # same path, different numbers
            return DecisionFlip(case, "", "", "", math.inf, float_error, False)
        w = want[k][1] if k < len(want) else "(none)"
        g, site = (got[k][1], got[k][0]) if k < len(got) else ("(none)", want[k][0])
        m = getattr(got[k], "margin", math.nan) if k < len(got) else math.nan
        return DecisionFlip(case, site, str(w), str(g), m, float_error, bool(m <= float_error))
    known = [d for d in got if not math.isnan(getattr(d, "margin", math.nan))]
    if not known:
        return DecisionFlip(case, "", "?", "?", math.nan, float_error, False)
    d = min(known, key=lambda d: d.margin)
    return DecisionFlip(case, d[0], "?", str(d[1]), d.margin, float_error, bool(d.margin <= float_error))


def parity(model: Any, method: str, jm: Any, cases: list[tuple[Any, ...]]
           ) -> tuple[dict[str, float], list[str], list[DecisionFlip]]:
    """Run torch and JAX on every case: the report's parity numbers, structural problems, and
    per disagreeing case whether a near-threshold decision flip explains it.

    The observed float error is the largest |torch - JAX| over the float outputs of the cases
    that agree, at least FLOAT_ERROR_FLOOR: how far the two implementations' arithmetic drifts
    on this model. A flipped decision whose margin is within it is counted as `decision_flips`;
    any other disagreement as `mismatches`."""
    import torch

    diff, match, total, floats, ints, problems = 0.0, 0, 0, 0, 0, []
    results = []
    for k, args in enumerate(cases):
        with torch.no_grad():
            ref = getattr(model, method)(*args)
        res = compare(ref, jm(*args))
        results.append(res)
        diff, match, total = max(diff, res["diff"]), match + res["match"], total + res["total"]
        floats, ints = max(floats, res["float"]), max(ints, res["int"])
        problems += [f"case {k}: {p}" for p in res["problems"]]
    float_error = max([FLOAT_ERROR_FLOOR] + [r["diff"] for r in results if r["agree"]])
    flips = []
    for k, res in enumerate(results):
        if not res["agree"]:
            want = _torch_decisions(model, method, cases[k]) if jm.host == "staged" else None
            flips.append(classify(k, want, jm.trace(*cases[k])[1], float_error))
    out: dict[str, float] = {"cases": len(cases), "float_outputs": floats, "max_abs_diff": diff}
    if ints:
        out.update(int_outputs=ints, int_match_rate=match / total if total else 1.0)
    if flips:
        out.update(float_error=float_error, decision_flips=sum(f.near_threshold for f in flips),
                   mismatches=sum(not f.near_threshold for f in flips))
    return out, problems, flips
