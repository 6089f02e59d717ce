"""Kernel quality inside control flow: one block run plainly, inside a `lax.cond` and inside a `while_loop`.

    python scripts/bench_cond_kernels.py [--runs N] [--batch B] [--no-pin]

XLA:CPU may compile an op inside a conditional or loop body differently from the same op at
top level (no fusion across the boundary, other layouts). For each block kind (3x3 conv
block, pooling, normalisation, bilinear interpolation) this converts three torch programs
with dycl_jax: the block alone, the block inside a data-dependent `if` (the other branch is
the identity), and the block applied in a tensor-conditioned `while` loop that runs it
exactly STEPS times. Printed: median ms per block application and the ratios cond/plain and
loop/plain (1.00: as fast inside as outside), with torch eager beside them. One thread on each
side, paired medians in one process; JAX at its default dispatch settings.
"""
from __future__ import annotations

import os
import sys

if "--no-pin" not in sys.argv[1:]:
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1").strip()

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dycl_jax import to_jax  # noqa: E402

torch.set_num_threads(1)
warnings.simplefilter("ignore")
STEPS = 3


class ConvBlock(nn.Module):
    def __init__(self, c: int = 32):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class PoolBlock(nn.Module):
    def forward(self, x):
        return F.max_pool2d(x, 3, 1, 1) + F.avg_pool2d(x, 3, 1, 1)


class NormBlock(nn.Module):
    def __init__(self, c: int = 32):
        super().__init__()
        self.gn, self.ln = nn.GroupNorm(4, c), nn.LayerNorm([c, 32, 32])

    def forward(self, x):
        return self.ln(self.gn(x))


class ResizeBlock(nn.Module):
    def forward(self, x):
        up = F.interpolate(x, scale_factor=2.0, mode="bilinear", align_corners=False)
        return F.interpolate(up, size=x.shape[-2:], mode="bilinear", align_corners=False)


class Plain(nn.Module):
    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x):
        return self.block(x)


class InCond(Plain):
    def forward(self, x):
        if x.mean() > -1e9:  # always true, but only the data says so
            y = self.block(x)
        else:
            y = x
        return y


class InLoop(Plain):
    def forward(self, x):
        n = torch.zeros((), dtype=torch.int64)
        while n < x.new_tensor(STEPS).long():  # a tensor test: a while_loop
            x = self.block(x)
            n = n + 1
        return x


def paired(fns: list, x: torch.Tensor, xj: jax.Array, runs: int) -> list[float]:
    times: list[list[float]] = [[] for _ in fns]
    for i in range(runs + 3):
        for j in (range(len(fns)) if i % 2 == 0 else reversed(range(len(fns)))):
            start = time.perf_counter()
            fns[j]()
            if i >= 3:
                times[j].append(time.perf_counter() - start)
    return [statistics.median(t) * 1e3 for t in times]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--no-pin", action="store_true")
    ns = p.parse_args()
    console = Console(width=120)
    table = Table(title=f"one block per application, batch {ns.batch}, 32x32x32 (ms; 1 thread each side)",
                  title_justify="left")
    for col in ("block", "torch", "plain", "in cond", "in loop", "cond/plain", "loop/plain", "torch/plain"):
        table.add_column(col, justify="right" if col != "block" else "left", no_wrap=True)
    torch.manual_seed(0)
    x = torch.randn(ns.batch, 32, 32, 32)
    xj = jax.device_put(x.numpy())
    for name, block in (("conv block", ConvBlock()), ("pooling", PoolBlock()), ("norm", NormBlock()),
                        ("bilinear", ResizeBlock())):
        models = [cls(block).eval() for cls in (Plain, InCond, InLoop)]
        jms = [to_jax(m, (x,), dynamic_batch=False) for m in models]
        with torch.inference_mode():
            for m, jm in zip(models, jms):
                diff = float(abs(m(x) - torch.from_numpy(jax.device_get(jm(xj)).copy())).max())
                assert diff < 1e-3, f"{name} {type(m).__name__}: differs from torch by {diff}"
            fns = [lambda: models[0](x)] + [lambda jm=jm: jax.block_until_ready(jm(xj)) for jm in jms]
            t_torch, plain, cond, loop = paired(fns, x, xj, ns.runs)
        loop /= STEPS
        table.add_row(name, f"{t_torch:.3f}", f"{plain:.3f}", f"{cond:.3f}", f"{loop:.3f}",
                      f"{cond / plain:.2f}", f"{loop / plain:.2f}", f"{t_torch / plain:.2f}")
    console.print(table)
    console.print("cond/plain, loop/plain: 1.00 means the block is as fast inside control flow as outside it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
