"""A chunk of a decode loop (host/chunks.py) takes each `if c: break` of its body as an exit: the
iterations go on along the branch that does not break, the values where it breaks are traced
beside them, so a Python counter stays a Python int (before, the staged cond made it a tensor,
and the next chunk ran in JAX's 64-bit scope); a loop that stops on every input within
`chunks.REACH` iterations (a Python bound) runs in one chunk. Every test compares with the
original torch model over inputs that take every exit."""
from __future__ import annotations

import importlib

import pytest
import torch
from torch import nn

import dycl_jax
from differential import assert_same
from dycl_jax.host import chunks, dispatch


class Decoder(nn.Module):
    """A GRU decoder growing `tokens`, its breaks written in the styles of `STYLES`."""

    def __init__(self, style: str, max_len: int = 7, end: int = 2) -> None:
        super().__init__()
        self.style, self.max_len, self.end = style, max_len, end
        self.embed = nn.Embedding(10, 12)
        self.cell = nn.GRUCell(12, 12)
        self.out = nn.Linear(12, 10)
        self.bias = nn.Linear(12, 1)

    def forward(self, h):
        tokens = torch.zeros(1, 1, dtype=torch.long)
        stop_bias = self.bias(h)
        step, total = 1, torch.zeros(())
        while True:
            emb = self.embed(tokens[:, tokens.size(1) - 1])
            h = self.cell(emb, h)
            logits = self.out(h)
            logits[:, self.end] = logits[:, self.end] + stop_bias[:, 0]
            word = logits.argmax(1).unsqueeze(1)
            tokens = torch.cat((tokens, word), 1)
            if self.style == "counter after":  # the break, then the counter the iteration goes on with
                if word.item() == self.end or step >= self.max_len:
                    break
                step += 1
            elif self.style == "work before the break":  # statements in the breaking branch, an update in place after
                if word.item() == self.end:
                    total = total + h.sum()
                    break
                h.mul_(0.9)
                step += 1
                if step > self.max_len:
                    break
            elif self.style == "break in else":  # the branch that breaks is the false one
                if word.item() != self.end and step < self.max_len:
                    step += 1
                else:
                    break
            else:  # "break in a tensor branch": the guard is nested in a staged cond
                if h.sum() > -100.0:
                    if word.item() == self.end:
                        break
                step += 1
                if step > self.max_len:
                    break
        return tokens, step, total


STYLES = ("counter after", "work before the break", "break in else", "break in a tensor branch")


def _inputs(n: int) -> list[tuple]:
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(1, 12, generator=g) * 2.0,) for _ in range(n)]


@pytest.mark.parametrize("style", STYLES)
def test_every_exit_of_a_chunked_loop_against_torch(style, monkeypatch):
    torch.manual_seed(3)
    model = Decoder(style).eval()
    cases = _inputs(50)
    jm = dycl_jax.to_jax(model, cases[0], host="dispatch")
    lengths = set()
    with torch.no_grad():
        for _ in range(2):  # the first time a new path runs the host loop, then the chunks serve it
            for k, case in enumerate(cases):
                want, got = model(*case), jm(*case)
                assert_same(want, got, f"{style}: input {k}")
                assert int(got[1]) == want[1], f"{style}: input {k}"
                # a guard inside a staged cond stays a cond, which joins the counter's two Python
                # ints into a tensor: there the chunk gives a 0-d array where torch (and the host
                # loop, on a path's first call) gives an int (known, not asserted)
                assert type(got[1]) is int or style == "break in a tensor branch", f"{style}: input {k}"
                lengths.add(want[0].shape[1])
    assert len(lengths) >= 4 and max(lengths) == model.max_len + 1, lengths  # <end> early and the bound
    chunk_calls = []
    run_island = dispatch.DispatchHost.run_island

    def counted(host, spec, *args):
        chunk_calls.append(chunks.is_chunk(spec))
        return run_island(host, spec, *args)

    monkeypatch.setattr(dispatch.DispatchHost, "run_island", counted)
    compilations = jm.report().compilations
    with torch.no_grad():
        for k, case in enumerate(cases):
            assert_same(model(*case), jm(*case), f"{style}: input {k}, again")
    assert jm.report().compilations == compilations
    # the loop stops on every input by `max_len` iterations: one chunk per call (where the counter
    # became a tensor, the bound is no Python stop: chunks of `STEPS` iterations)
    per_call = 1 if style != "break in a tensor branch" else -(-(model.max_len + 1) // chunks.STEPS)
    assert len(cases) <= sum(chunk_calls) <= per_call * len(cases), f"{sum(chunk_calls)} chunk calls"
    assert style == "break in a tensor branch" or sum(chunk_calls) == len(cases)
    programs = [c for st in jm._fn.regions.values() if chunks.is_chunk(st.spec)
                for c in st.parts[0].cache.values() if isinstance(c, dispatch.Compiled)]
    assert programs and (not any(c.x64 for c in programs) or style == "break in a tensor branch")


def test_the_captioning_decoder_is_one_program_per_call_in_32_bit(monkeypatch):
    """The statements before the loop (the encoder) and after it (`torch.stack(alphas)`) run in
    the chunk's program, and the loop stops on every input within `REACH`: one program a call."""
    mod = importlib.import_module("examples.dynn.captioning")
    model, args = mod.example()
    jm = dycl_jax.to_jax(model, args, host="dispatch")
    cases = mod.inputs(24, seed=3)
    paths = set()
    with torch.no_grad():
        for _ in range(2):
            for k, case in enumerate(cases):
                assert_same(model(*case), jm(*case), f"captioning input {k}")
                paths.add(mod.path_of(model, case))
    assert len(paths) >= 5, paths
    runs: list[bool] = []
    run = dispatch.Compiled.run
    monkeypatch.setattr(dispatch.Compiled, "run", lambda c, *a: runs.append(c.x64) or run(c, *a))
    with torch.no_grad():
        for k, case in enumerate(cases):
            assert_same(model(*case), jm(*case), f"captioning input {k}, again")
    assert len(runs) == len(cases) and not any(runs), f"{len(runs)} programs for {len(cases)} calls"


class AroundTheLoop(nn.Module):
    """Statements before and after a decode loop that needs several chunks (a tensor test, no
    Python bound): a value made before the loop and read only after it, a name the body assigns
    without reading it (`last`), an update in place after the loop, a host read before the loop
    in one style (which keeps the statements up to it out of the chunk's program)."""

    def __init__(self, style: str) -> None:
        super().__init__()
        self.style = style
        self.cell = nn.GRUCell(12, 12)
        self.embed = nn.Embedding(10, 12)
        self.out = nn.Linear(12, 10)

    def forward(self, h):
        scale = h.abs().mean()
        if self.style == "host read before":
            limit = 1.5 + 0.0 * float(h.sum().item())
        else:
            limit = 1.5
        tokens = torch.zeros(1, 1, dtype=torch.long)
        last = torch.zeros(1, 12)
        while h.norm() > limit and tokens.size(1) < 14:
            h = self.cell(self.embed(tokens[:, -1]), h) * 0.9
            last = h * 2
            tokens = torch.cat([tokens, self.out(h).argmax(-1, keepdim=True)], dim=1)
        summary = last.sum() * scale
        last.mul_(0.5)  # (an update in place after the loop: a region of its own, not in the chunk)
        return tokens, summary, scale, last


@pytest.mark.parametrize("style", ["constant bound", "host read before"])
def test_statements_around_a_chunked_loop_against_torch(style):
    torch.manual_seed(4)
    model = AroundTheLoop(style).eval()
    g = torch.Generator().manual_seed(9)
    cases = [(torch.randn(1, 12, generator=g) * s,) for s in (0.1, 0.5, 1.0, 2.0, 4.0, 8.0) * 3]
    jm = dycl_jax.to_jax(model, cases[3], host="dispatch")
    lengths = set()
    with torch.no_grad():
        for _ in range(2):
            for k, case in enumerate(cases):
                want = model(*case)
                assert_same(want, jm(*case), f"{style}: input {k}")
                lengths.add(want[0].shape[1])
    assert 1 in lengths and max(lengths) > chunks.STEPS + 1, lengths  # no iteration, and several chunks
    fused = [st for st in jm._fn.regions.values() if chunks.is_chunk(st.spec) and st.spec.resume is not None]
    # the statements before the loop (from the last host read or branch on) run in its first chunk
    assert len(fused) == 1 and fused[0].parts[0].host_reason is None
    assert "scale" in fused[0].spec.resume  # made before the loop, read after it: passed on to later chunks
