"""Training-mode capture: the model in `train()` mode, BatchNorm updating its statistics
through `rewrite.state_writes` so that one inside a staged branch can still be captured."""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from dycl_jax.rewrite import state_writes


def _forward(bn: _BatchNorm):
    """torch's _BatchNorm.forward in training mode, with the running-statistics update written
    as new tensors (state_writes.write) rather than by the fused kernel in place."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        bn._check_input_dim(x)
        if not bn.training or not bn.track_running_stats or bn.running_mean is None:
            return type(bn).forward(bn, x)  # nothing to update: torch's own code
        buffers = bn._buffers
        count = bn.num_batches_tracked + 1
        state_writes.write(buffers, "num_batches_tracked", count)
        factor = 1.0 / count if bn.momentum is None else bn.momentum  # cumulative average when None
        # written out rather than F.batch_norm, whose kernel torch.export wraps in set_grad_enabled
        # regions that it then cannot split inside a nested cond branch (no_grad() likewise)
        dims = [0] + list(range(2, x.dim()))
        shape = [1, -1] + [1] * (x.dim() - 2)
        mean = x.mean(dims, keepdim=True)
        biased = x.var(dims, correction=0, keepdim=True)
        out = (x - mean) * torch.rsqrt(biased + bn.eps)
        if bn.affine:
            out = out * bn.weight.view(shape) + bn.bias.view(shape)
        # torch's update is no part of the autograd graph
        n = x.numel() // x.shape[1]
        mean = mean.detach().flatten()
        var = biased.detach().flatten() * (n / max(n - 1, 1))  # torch stores the unbiased variance
        state_writes.write(buffers, "running_mean", (1 - factor) * bn.running_mean + factor * mean)
        state_writes.write(buffers, "running_var", (1 - factor) * bn.running_var + factor * var)
        return out

    return forward


@contextlib.contextmanager
def training(model: torch.nn.Module) -> Iterator[None]:
    """`model.train()` with the BatchNorm layers patched (see _forward) while the block runs."""
    was_training = model.training
    patched = [m for m in model.modules() if isinstance(m, _BatchNorm) and "forward" not in m.__dict__]
    model.train()
    for m in patched:
        m.forward = _forward(m)
    try:
        yield
    finally:
        for m in patched:
            del m.forward
        model.train(was_training)
