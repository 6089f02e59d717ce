"""Fixed-point refinement (DEQ-style): a residual-driven while loop with a coarse/fine branch in every iteration."""

from __future__ import annotations

import torch
import torch.nn as nn

from examples.dynn import count_calls, seeded


class FixedPointRefiner(nn.Module):
    """Solves z = tanh(W z + U x) by iteration. Far from the solution a plain fixed-point
    step is taken; close to it a learned preconditioner refines the step."""

    def __init__(self, in_dim=16, hidden=32, num_classes=4, tol=1e-2, coarse_tol=0.3, max_iter=5,
                 contraction=0.9):
        super().__init__()
        self.tol = tol
        self.coarse_tol = coarse_tol
        self.max_iter = max_iter
        self.hidden = hidden
        # no bias: x = 0 has the fixed point z = 0
        self.inject = nn.Linear(in_dim, hidden, bias=False)
        self.W = nn.Linear(hidden, hidden, bias=False)
        self.precond = nn.Linear(hidden, hidden, bias=False)
        self.head = nn.Linear(hidden, num_classes)
        with torch.no_grad():
            # keep the map a contraction so the iteration converges
            self.W.weight.mul_(contraction / torch.linalg.matrix_norm(self.W.weight, ord=2))
            nn.init.eye_(self.precond.weight)
            self.precond.weight.add_(0.02 * torch.randn(hidden, hidden))

    def f(self, z, u):
        return torch.tanh(self.W(z) + u)

    def forward(self, x):
        u = self.inject(x)
        z = torch.zeros(x.size(0), self.hidden)
        r = self.f(z, u) - z
        n_iter = 0
        while r.norm() > self.tol and n_iter < self.max_iter:
            if r.norm() > self.coarse_tol:
                z = z + r
            else:
                z = z + self.precond(r)
            r = self.f(z, u) - z
            n_iter += 1
        return self.head(z), n_iter


MAX_ITER = 5
PATHS = (
    ("iterations", 0), ("iterations", 1), ("iterations", "several"), ("iterations", "limit"),
    ("branch", "coarse"), ("branch", "fine"),
)


def example() -> tuple[nn.Module, tuple]:
    with seeded(0):
        model = FixedPointRefiner(max_iter=MAX_ITER).eval()
    return model, inputs(1)[0]


def inputs(n: int, seed: int = 0) -> list[tuple]:
    # log-scales from 1e-3 (already converged: no iteration) to ~3 (slow: stopped by the
    # limit), stratified so that the narrow band of one-iteration scales is always sampled
    g = torch.Generator().manual_seed(seed)
    strata = torch.randperm(n, generator=g)
    out = []
    for i in range(n):
        pos = (float(strata[i]) + float(torch.rand((), generator=g))) / n
        scale = 10 ** (-3.0 + 3.5 * pos)
        out.append((torch.randn(1, 16, generator=g) * scale,))
    return out


def path_of(model: nn.Module, args: tuple) -> tuple:
    with torch.no_grad(), count_calls(model, ["precond"]) as calls:
        _, n_iter = model(*args)
    fine = calls["precond"]
    coarse = n_iter - fine
    # "limit": the loop ran max_iter times (for most such inputs the limit is what stopped it)
    if n_iter >= model.max_iter:
        label = ("iterations", "limit")
    elif n_iter >= 2:
        label = ("iterations", "several")
    else:
        label = ("iterations", n_iter)
    return (label,) + ((("branch", "coarse"),) if coarse else ()) + ((("branch", "fine"),) if fine else ())
