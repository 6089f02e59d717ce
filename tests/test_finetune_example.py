"""examples/finetune_early_exit.py, short: the loss goes down, the exits taken change, and the
torch model loaded with the trained state_dict gives the trained JAX model's outputs."""
from __future__ import annotations

import numpy as np

from examples.finetune_early_exit import finetune  # needs optax: the `test` and `finetune` extras


def test_finetune_early_exit_short_run():
    r = finetune(steps=40, lr=1e-2)
    assert np.mean(r.losses[-5:]) < 0.5 * np.mean(r.losses[:5])
    assert r.exits_before != r.exits_after
    assert r.exits_after[0] > r.exits_before[0]  # the first classifier got confident
    assert sum(r.exits_after.values()) == sum(r.exits_before.values()) == 256
    assert r.max_roundtrip_diff < 1e-5 and r.roundtrip_exits_equal
