"""Host reads on the dispatch host: `n = expr.tolist()` / `[int|float|bool](expr.item())` run `expr`
in the compiled region and read the array with numpy (rewrite/converters/host_reads.py,
host/reads.py). Results, Python types included, equal the ORIGINAL torch model's."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch as th
from torch import nn

import dycl_jax
from dycl_jax.host.dispatch import READ
from dycl_jax.rewrite.converters.host_reads import READ_TEMP


class Lengths(nn.Module):
    """Caption lengths read into a list, then a batch that shrinks by them (teacher forcing)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 3)

    def forward(self, x, lengths):
        h = self.proj(x)
        decode = (lengths - 1).tolist()
        out = torch.zeros(x.shape[0], max(decode), 3)
        for t in range(max(decode)):
            n = sum([l > t for l in decode])
            h = torch.tanh(h[:n])
            out[:n, t] = h
        return out, decode


class Counts(nn.Module):
    """A count and a mean read with `.item()` under int() and float(), a flag under bool()."""

    def forward(self, x):
        y = torch.relu(x) - 0.5
        k = int((y > 0).sum().item())
        m = float(y.mean().item())
        flag = bool((y > 1.0).any().item())
        first = y[: max(k, 1)]
        return first * m, k, m, flag


class Reads(nn.Module):
    """Reads of other dtypes: bool masks, uint8, float16, int64 beyond int32, a bare name, a 0-d list."""

    def forward(self, x, ids):
        mask = (x > 0).tolist()
        small = (x * 10).to(torch.uint8).tolist()
        half = x.half().tolist()
        big = (ids * 4_000_000_000).tolist()  # int64 values far beyond int32
        raw = ids.tolist()
        scalar = x.sum().tolist()  # 0-d: a Python float, not a list
        return mask, small, half, big, raw, scalar, x + len(mask)


class Routes(nn.Module):
    """Top-1 routing with per-expert index lists (`nonzero(as_tuple=True)[0]`), a row-major
    `nonzero()` of a 2-D mask, and an index read from the last axis (`[-1]`)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(4, 3)
        self.experts = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        idx = self.gate(x).argmax(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            sel = (idx == e).nonzero(as_tuple=True)[0]
            if sel.numel() == 0:
                continue
            out[sel] = expert(x[sel])
        pos = (x > 0.5).nonzero()
        cols = (x.reshape(2, -1) < 0).nonzero(as_tuple=True)[-1]
        return out, pos, cols


class FunctionRoutes(Routes):
    """The same routing in torch's function style: `torch.where(mask)[0]`, `torch.nonzero(m)`,
    `th.nonzero(..., as_tuple=True)[-1]` through another name for torch."""

    def forward(self, x):
        idx = self.gate(x).argmax(-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            sel = torch.where(idx == e)[0]
            if len(sel) == 0:
                continue
            out[sel] = expert(x[sel])
        pos = torch.nonzero(x > 0.5)
        cols = th.nonzero(x.reshape(2, -1) < 0, as_tuple=True)[-1]
        return out, pos, cols


class Masks(nn.Module):
    """Boolean-mask selections: of a computed value, by a comparison, `~`, `&`, a 2-D mask of a
    3-D tensor, an int64 tensor beyond int32, and an index that is not a mask (a plain gather)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x, ids):
        rows = self.proj(x)[x.sum(1) > 0]
        pos = x[x > 0]
        keep = ~(x < -1.0)
        kept = x[keep]
        both = x[(x > 0) & (x < 1.0)]
        cube = x.reshape(2, 3, 4)[x.reshape(2, 3, 4).sum(-1) > 0]
        big = (ids + 4_000_000_000)[ids > 1]
        order = ids.argsort()
        gathered = x[order]  # an int index: no mask, computed as before
        return rows, pos, kept, both, cube, big, gathered


def _cases(name: str, n: int) -> list[tuple]:
    g = torch.Generator().manual_seed(11)
    if name == "lengths":
        return [(torch.randn(4, 3, generator=g), torch.randint(2, 7, (4,), generator=g)) for _ in range(n)]
    if name in ("routes", "function routes"):
        return [(torch.randn(6, 4, generator=g),) for _ in range(n)]
    if name == "masks":
        return [(torch.randn(6, 4, generator=g), torch.randint(-2, 4, (6,), generator=g)) for _ in range(n)]
    if name == "counts":
        return [(torch.randn(6, generator=g) * 2,) for _ in range(n)]
    return [(torch.randn(5, generator=g), torch.randint(-3, 4, (3,), generator=g)) for _ in range(n)]


def _same(want, got, where: str) -> None:
    """Python values equal with their types (ints and bools exactly, floats to 1e-5); tensors as arrays."""
    if isinstance(want, torch.Tensor):
        np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-6, err_msg=where)
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), (where, got, want)
        for i, (w, g) in enumerate(zip(want, got)):
            _same(w, g, f"{where}[{i}]")
    else:
        assert type(got) is type(want), (where, type(got), type(want))
        if isinstance(want, float):  # computed by XLA, then read: float32 rounding apart
            assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), (where, got, want)
        else:
            assert got == want, (where, got, want)


@pytest.mark.parametrize("name, cls", [("lengths", Lengths), ("counts", Counts), ("reads", Reads), ("routes", Routes),
                                        ("function routes", FunctionRoutes), ("masks", Masks)])
def test_reads_equal_torch_with_python_types(name: str, cls) -> None:
    torch.manual_seed(0)
    model = cls().eval()
    cases = _cases(name, 10)
    jm = dycl_jax.to_jax(model, cases[0], host="dispatch")
    kinds = set()
    for case in cases:
        with torch.no_grad():
            want = model(*case)
        got = jm(*(t.numpy() for t in case))
        _same(want, got, name)
        kinds.add(repr(want[1])[:40] if name not in ("routes", "function routes", "masks") else tuple(want[1].shape))
    assert len(kinds) > 2, "the inputs should read several values"
    parts = [(st.spec.statements[p.first], p) for st in jm._fn.regions.values() for p in st.parts]
    read = [(s, p) for s, p in parts if READ in p.cache.values()]
    assert read, "no statement was read with numpy"
    assert all(p.stop - p.first == 1 and s.read is not None for s, p in read)
    # each read statement's tensor work runs in a compiled part: the read takes only its temp or a name
    for s, p in read:
        names = tuple(sorted({s.read.source, s.read.mask} - {""}))
        assert p.ins == names and (s.read.source.startswith(READ_TEMP) or name in ("reads", "masks")), (s, p.ins)
    if name in ("routes", "function routes"):  # the experts' selection (one statement in the loop), the 2-D positions, the columns
        assert len(read) == 3, [s.code for s, _ in read]
    if name == "masks":  # every selection by a mask; the gather by `order` is no read
        assert len(read) == 6 and not any("order" in s.code for s, _ in read), [s.code for s, _ in read]


def test_item_of_several_elements_is_torchs_error() -> None:
    class Bad(nn.Module):
        def forward(self, x):
            return x + int((x * 2).item())

    model = Bad().eval()
    jm = dycl_jax.to_jax(model, (torch.ones(1),), host="dispatch")
    assert float(np.asarray(jm(np.ones(1, np.float32)))[0]) == 3.0
    with pytest.raises(Exception) as torch_error:
        model(torch.ones(3))
    with pytest.raises(Exception) as ours:
        jm(np.ones(3, np.float32))
    assert "3 elements" in str(torch_error.value) and "3 elements" in str(ours.value), str(ours.value)


def test_report_names_the_read_statement_in_the_users_words() -> None:
    model = Lengths().eval()
    case = _cases("lengths", 1)[0]
    jm = dycl_jax.to_jax(model, case, host="dispatch")
    text = "\n".join(jm.report().host_statements)
    assert "(lengths - 1).tolist()" in text and "numpy reads the array" in text, text
