"""Two fuzz-found rewrite shapes, in several styles: nested static `for` loops that reuse one
loop variable's name with a data-dependent `break` at both levels (the outer `break` was lost),
and a variable first assigned after a static `for` loop whose body always returns (NameError at
capture). Each is compared with the ORIGINAL torch model on every host that applies."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import dycl_jax
from differential import assert_same  # pytest puts tests/ on sys.path


class ReusedNameBreaks(nn.Module):
    """Both loops are `for i`; the inner break ends the row, the outer one the whole scan."""

    def forward(self, x):
        out = x * 0
        for i in range(3):
            for i in range(3):
                if (x * (i + 1)).sum() > 2.0:
                    break
                out = out + x * i
            if out.sum() < -1.0:
                break
            out = out + 0.5
        return out, i


class ReusedNameEnumerate(nn.Module):
    """The reused name comes from `enumerate` over a ModuleList; the outer break tests the
    counter the inner loop left behind, the inner one a layer's output."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        steps = 0
        for k, layer in enumerate(self.layers):
            for k in range(2):
                x = torch.tanh(layer(x))
                steps += 1
                if x.mean() > 0.1:
                    break
            if x.max() > 0.6 and k == 0:
                break
        return x, steps


class ReusedNameFlags(nn.Module):
    """Python bool flags named like the ones a rewrite might make (`stop`, `done`), a `while`
    between the loops, and the outer break under an `else` branch."""

    def forward(self, x):
        done = False
        stop = 0
        for j in range(4):
            for j in range(2):
                x = x * 0.9 + 0.1
                if x.sum() > 3.0:
                    stop = j
                    break
            if x.min() > 0.0:
                x = x - 0.2
            else:
                done = True
                break
        return x, done, stop


class ForAlwaysReturns(nn.Module):
    """The loop body returns on its first pass: the code after the loop never runs, and the
    variable it first assigns does not exist before it."""

    def forward(self, x):
        for i in range(3):
            if x.sum() > 0:
                return x * 2, i
            return x - 1, i
        late = x + 1
        return late, -1

    def path(self, x) -> bool:
        return bool(x.sum() > 0)


class ForAlwaysReturnsLeftover(nn.Module):
    """As above, with statements after the return inside the body (Python drops them) and a
    list first built after the loop."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        for layer in [self.lin, self.lin]:
            h = layer(x)
            if h.mean() > 0:
                return h
            else:
                return -h
            h = h * 100  # unreachable
        outs = [x]
        outs.append(x * 3)
        return torch.stack(outs).sum(0)

    def path(self, x) -> bool:
        return bool(self.lin(x).mean() > 0)


class ForReturnsOnSomePaths(nn.Module):
    """A loop whose body returns only on one side: after it, a variable first assigned there."""

    def forward(self, x):
        for i in range(3):
            x = x + 1
            if x.sum() > 6:
                return x, i
        tail = x * 10
        return tail, 99


BREAK_MODELS = [ReusedNameBreaks, ReusedNameEnumerate, ReusedNameFlags]
RETURN_MODELS = [ForAlwaysReturns, ForAlwaysReturnsLeftover, ForReturnsOnSomePaths]


def _inputs() -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(2, 4, generator=g) * s + b,) for s in (0.2, 1.0, 3.0) for b in (-0.6, 0.0, 0.6)
            for _ in range(3)]


def _outcomes(model: nn.Module, inputs: list[tuple]) -> set:
    """Which break or return each input took: the model's `path` where its Python-valued
    outputs do not tell, else those outputs."""
    with torch.no_grad():
        if hasattr(model, "path"):
            return {model.path(*args) for args in inputs}
        return {tuple(model(*args)[1:]) for args in inputs}


@pytest.mark.parametrize("host", ["staged", "auto", "dispatch"])
@pytest.mark.parametrize("cls", BREAK_MODELS + RETURN_MODELS, ids=lambda c: c.__name__)
def test_matches_the_original_model(cls, host: str) -> None:
    model = cls().eval()
    inputs = _inputs()
    assert len(_outcomes(model, inputs)) >= 2, "the inputs take one path only: the test misses the case"
    jm = dycl_jax.to_jax(model, inputs[0], host=host)
    for k, args in enumerate(inputs):
        with torch.no_grad():
            want = model(*args)
        assert_same(want, jm(*args), f"{cls.__name__} input {k} ({host})")


def test_the_outer_break_is_taken() -> None:
    # the case the lost outer break got wrong: an input that breaks out of both loops at once
    model = ReusedNameBreaks()
    x = torch.full((2, 4), -0.5)
    with torch.no_grad():
        want = model(x)
    assert want[1] == 2 and float(want[0].sum()) < -1.0  # the outer loop stopped after its first pass
    assert_same(want, dycl_jax.to_jax(model, (x,), host="staged")(x), "outer break")
