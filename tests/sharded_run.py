"""Run in a subprocess with 8 host devices: a staged DyNN data-parallel under NamedSharding."""
from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import dycl_jax  # noqa: E402
from examples.dynn import load  # noqa: E402


def main() -> None:
    assert jax.device_count() == 8, jax.devices()
    mod = load("shallow_deep")
    model, args = mod.example()
    jm = dycl_jax.to_jax(model, args)
    inputs = mod.inputs(16)
    x = np.stack([a[0].numpy() for a in inputs])  # 16 single samples: the model is batch-1 code
    mesh = Mesh(np.array(jax.devices()), ("data",))
    state = jax.device_put(nnx.state(jm.module), NamedSharding(mesh, PartitionSpec()))  # replicated
    xs = jax.device_put(x, NamedSharding(mesh, PartitionSpec("data")))
    run = jax.jit(jax.vmap(jm.apply, in_axes=(None, 0)))
    out = run(state, xs)
    logits = jax.tree.leaves(out)[0]
    assert len(logits.sharding.device_set) == 8, logits.sharding  # every device computed its samples
    for i, a in enumerate(inputs):
        with torch.no_grad():
            want = jax.tree.leaves(model(*a))
        for got, w in zip(jax.tree.leaves(out), want):
            w = w.numpy() if isinstance(w, torch.Tensor) else np.asarray(w)
            g = np.asarray(got[i])
            if np.issubdtype(w.dtype, np.floating):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
            else:
                np.testing.assert_array_equal(g.astype(w.dtype), w)
    print("sharded ok", len({mod.path_of(model, a) for a in inputs}), "paths")


if __name__ == "__main__":
    main()
