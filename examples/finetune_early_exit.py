"""Fine-tune a converted early-exit network in JAX with optax, then hand the weights back to torch.

    PYTHONPATH=. .venv/bin/python examples/finetune_early_exit.py [--steps 300]

Needs optax (`pip install dycl_jax[finetune]`). The torch model answers at the first exit whose
softmax confidence reaches a threshold (`if conf >= self.threshold: return ...`), so its
`forward` converts to one staged program with `lax.cond`s; `exit_logits` (all exits, as
early-exit networks are trained) converts as a second program over the same parameters. The
loss is the cross-entropy of every exit plus that of the answer the early-exit program gives
(a gradient through `lax.cond`, per sample under `jax.vmap`). After training, fewer samples
need the last exit, and the weights go back into the torch model through a `state_dict`.
"""
from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import torch.nn as nn
import torch.nn.functional as F
from flax import nnx

import dycl_jax
from dycl_jax.runtime.state import to_state_dict

DIM, CLASSES = 8, 4


class EarlyExitMLP(nn.Module):
    """Three blocks with a classifier after each; the first confident classifier answers."""

    def __init__(self, threshold: float = 0.8):
        super().__init__()
        self.blocks = nn.ModuleList(
            [nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, DIM)) for _ in range(3)])
        self.heads = nn.ModuleList([nn.Linear(DIM, CLASSES) for _ in range(3)])
        self.threshold = threshold

    def exit_logits(self, x):
        h, outs = x, []
        for block, head in zip(self.blocks, self.heads):
            h = h + block(h)
            outs.append(head(h))
        return torch.stack(outs)

    def forward(self, x):
        h = x
        for i in range(len(self.blocks)):
            h = h + self.blocks[i](h)
            logits = self.heads[i](h)
            conf = F.softmax(logits[0], dim=0).max()
            if conf.item() >= self.threshold and i < len(self.blocks) - 1:
                return logits, i
        return logits, len(self.blocks) - 1


def synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian clusters, one per class, some closer to their neighbours than others."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(CLASSES, DIM)).astype(np.float32) * 1.5
    y = rng.integers(0, CLASSES, n)
    x = centres[y] + rng.normal(size=(n, DIM)).astype(np.float32)
    return x.astype(np.float32), y


@dataclass
class Result:
    losses: list[float]
    exits_before: Counter
    exits_after: Counter
    max_roundtrip_diff: float  # |torch with the trained weights - trained JAX model|, largest output
    roundtrip_exits_equal: bool


def finetune(steps: int = 300, seed: int = 0, lr: float = 3e-3, verbose: bool = False) -> Result:
    torch.manual_seed(seed)
    model = EarlyExitMLP().eval()
    x, y = synthetic(256, seed)
    example = torch.from_numpy(x[:1])
    answer = dycl_jax.to_jax(model, example)  # the early-exit forward: lax.cond per exit
    every = dycl_jax.to_jax(model, torch.from_numpy(x[:2]), method="exit_logits")  # batch 2: symbolic batch
    params = nnx.state(answer.module).split(nnx.Param, ...)[0]

    # one sample per call, as the model is written; vmap makes each lax.cond a per-sample select
    per_sample = jax.jit(jax.vmap(lambda p, xi: answer.apply(p, xi[None]), in_axes=(None, 0)))

    def exits(p) -> Counter:
        return Counter(int(i) for i in np.asarray(per_sample(p, jnp.asarray(x))[1]))

    def loss_fn(p, xb, yb):
        all_exits = every.apply(p, xb)  # (exits, batch, classes)
        joint = optax.softmax_cross_entropy_with_integer_labels(all_exits, yb[None]).mean()
        answered = jax.vmap(lambda xi: answer.apply(p, xi[None])[0][0])(xb)  # through the lax.conds
        return joint + optax.softmax_cross_entropy_with_integer_labels(answered, yb).mean()

    opt = optax.adam(lr)
    opt_state = opt.init(params)

    @jax.jit
    def step(p, s, xb, yb):
        loss, g = jax.value_and_grad(loss_fn)(p, xb, yb)
        updates, s = opt.update(g, s, p)
        return optax.apply_updates(p, updates), s, loss

    before = exits(params)
    rng = np.random.default_rng(seed + 1)
    losses = []
    for k in range(steps):
        idx = rng.choice(len(x), 64, replace=False)
        params, opt_state, loss = step(params, opt_state, jnp.asarray(x[idx]), jnp.asarray(y[idx]))
        losses.append(float(loss))
        if verbose and (k % 50 == 0 or k == steps - 1):
            print(f"step {k:4d}  loss {losses[-1]:.4f}")
    after = exits(params)

    # back to torch: the trained values under their torch paths, loaded strictly
    model.load_state_dict(to_state_dict(params, model.state_dict()))
    want_logits, want_exits = (np.asarray(v) for v in per_sample(params, jnp.asarray(x[:32])))
    diff, same = 0.0, True
    for xi, want, want_exit in zip(x[:32], want_logits, want_exits):
        with torch.no_grad():
            got, got_exit = model(torch.from_numpy(xi[None]))
        diff = max(diff, float(np.abs(got.numpy() - want).max()))
        same &= int(got_exit) == int(want_exit)
    return Result(losses, before, after, diff, same)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    r = finetune(args.steps, verbose=True)
    print(f"loss: {np.mean(r.losses[:10]):.4f} (first 10 steps) -> {np.mean(r.losses[-10:]):.4f} (last 10)")
    print("exits taken over 256 samples, before:", dict(sorted(r.exits_before.items())))
    print("exits taken over 256 samples, after: ", dict(sorted(r.exits_after.items())))
    print(f"torch with the trained state_dict vs JAX: max |diff| {r.max_roundtrip_diff:.2e}, "
          f"same exits: {r.roundtrip_exits_equal}")


if __name__ == "__main__":
    main()
