"""Tail islands of the dispatch host: the end of a function whose early returns sit inside a
loop runs as one staged program (its returns made one exit); where it cannot stage, its host
version runs. Either way the result is the original torch model's on every exit."""
from __future__ import annotations

import torch
from torch import nn

import dycl_jax
from differential import assert_same  # pytest puts tests/ on sys.path


class EarlyExit(nn.Module):
    """Early exit over blocks, research style: a Python list of logits, a Python-int exit id,
    an exit flag built as a tensor, and a fallback to the most confident head after the loop."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.heads = nn.ModuleList(nn.Linear(8, 3) for _ in range(3))
        self.threshold = 0.6

    def forward(self, x):
        outs = []
        h = x
        for i, (blk, head) in enumerate(zip(self.blocks, self.heads)):
            h = torch.relu(blk(h)) + h
            logits = head(h)
            outs.append(logits)
            conf = logits.softmax(-1).max()
            if conf > self.threshold:
                exited = torch.tensor(1)
                return logits, i, exited
        best = torch.stack([o.softmax(-1).max() for o in outs]).argmax()
        return outs[-1] * 0 + torch.stack(outs)[best], len(outs), torch.tensor(0)


class ShapeExit(nn.Module):
    """Each exit returns a different width: no staged program can hold them, so the tail's host
    version runs (and so does every region inside it)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        for k in range(3):
            x = torch.tanh(self.fc(x))
            if x.sum() > 1:
                return x[:, :k + 1]
        return x


def _inputs(n: int, width: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, width, generator=g) * (0.2 + 3 * (k % 5) / 4) for k in range(n)]


def _exit_of(out) -> object:
    return (out[1], int(out[2])) if isinstance(out, tuple) else out.shape[1]


def _check(model: nn.Module, width: int, exits: int) -> dycl_jax.JaxModel:
    model.eval()
    xs = _inputs(40, width)
    jm = dycl_jax.to_jax(model, (xs[0],), host="dispatch")
    seen = set()
    for k, x in enumerate(xs):
        with torch.no_grad():
            want = model(x)
        assert_same(want, jm(x), f"{type(model).__name__} input {k}")
        seen.add(_exit_of(want))
    assert len(seen) == exits, seen  # every exit taken
    return jm


def test_early_exit_loop_is_one_staged_island() -> None:
    torch.manual_seed(0)
    model = EarlyExit()
    jm = _check(model, 8, 4)
    host = jm._fn
    tails = [st for st in host.regions.values() if st.spec.tail]
    assert len(tails) == 1 and not host.failed_islands(), host.failed_islands()
    # the whole forward is that island: no region runs, and every decision is the one the
    # staged program makes inside it (the host decides nothing of its own)
    assert all(st.spec.tail for st in host.regions.values())
    staged = dycl_jax.to_jax(model, (_inputs(1, 8)[0],), host="staged")
    for x in _inputs(6, 8):
        decisions = jm.trace(x)[1]
        assert decisions and decisions == staged.trace(x)[1]


def test_tail_that_cannot_stage_runs_its_host_version() -> None:
    torch.manual_seed(0)
    jm = _check(ShapeExit(), 6, 4)
    host = jm._fn
    assert any(label.startswith("tail island@") for label in host.failed_islands()), host.failed_islands()
    assert any(st.spec.kind == "region" for st in host.regions.values())
