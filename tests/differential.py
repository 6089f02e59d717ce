"""The differential comparison every end-to-end test uses: converted outputs against the original
torch model's, with the same structure and shapes, floats within tolerance, integers exact."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

RTOL, ATOL = 1e-4, 1e-4  # float outputs; integer and bool outputs (tokens, exit ids, flags) must be equal


def assert_same(want: Any, got: Any, where: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    w_leaves, w_spec = pytree.tree_flatten(want)
    g_leaves, g_spec = pytree.tree_flatten(got)
    assert w_spec == g_spec, f"{where}: output structure {g_spec} != torch's {w_spec}"
    for i, (w, g) in enumerate(zip(w_leaves, g_leaves)):
        w = w.detach().numpy() if isinstance(w, torch.Tensor) else np.asarray(w)
        g = np.asarray(g)
        assert w.shape == g.shape, f"{where}: leaf {i} shape {g.shape} != {w.shape}"
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{where}: leaf {i}")
        else:
            np.testing.assert_array_equal(g.astype(np.int64), w.astype(np.int64), err_msg=f"{where}: leaf {i}")
