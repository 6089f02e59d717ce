"""Small dynamic networks written as research code writes them (lists, `.item()`, numpy, builtins
over tensors, ModuleDicts, dict/namedtuple/dataclass outputs), each with inputs that take
every path. `tests/test_research_styles.py` converts the cheap ones and compares them with torch;
`python tests/research_styles.py` runs every model on every host."""
from __future__ import annotations

import logging
from collections import namedtuple
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

log = logging.getLogger("research_styles")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- CALM-style token-level early exit in a small transformer --------------------------------

class TinyBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        return x + self.ff(self.ln(x))


class CALM(nn.Module):
    """Tokens whose confidence passed the threshold keep their state (copied forward); the
    stack stops once every token has exited. Dict output, `enumerate`, `torch.no_grad()`,
    f-string logging, `torch.where` for the per-token update."""

    def __init__(self, d=16, vocab=11, n_layers=4, threshold=0.16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([TinyBlock(d) for _ in range(n_layers)])
        self.head = nn.Linear(d, vocab)
        self.threshold = threshold

    def forward(self, ids):
        h = self.embed(ids)
        exited = torch.zeros(ids.shape, dtype=torch.bool)
        exit_layer = torch.full(ids.shape, len(self.layers))
        depth = 0
        for i, layer in enumerate(self.layers):
            new_h = layer(h)
            h = torch.where(exited[..., None], h, new_h)
            depth = i + 1
            with torch.no_grad():
                conf = F.softmax(self.head(h), -1).max(-1).values
            newly = (conf > self.threshold) & ~exited
            exit_layer[newly] = i
            exited = exited | newly
            log.debug(f"layer {i}: {int(exited.sum())} tokens exited")
            if exited.all():
                break
        return {"logits": self.head(h), "exit_layer": exit_layer, "depth": depth}


def calm_inputs(n):
    g = _gen(1)
    return [(torch.randint(0, 11, (1, 3), generator=g),) for _ in range(n)]


# --- top-2 MoE with torch.topk and index_add_ --------------------------------------------------

MoEOut = namedtuple("MoEOut", ["out", "load"])


class Top2MoE(nn.Module):
    """Top-2 routing: per expert, the (token, slot) pairs routed to it by `nonzero`, skipped
    when empty, combined with `index_add_`; load per expert as a Python list (`.tolist()`)."""

    def __init__(self, d=8, n_experts=4):
        super().__init__()
        self.router = nn.Linear(d, n_experts)
        self.experts = nn.ModuleDict({f"e{e}": nn.Sequential(nn.Linear(d, 12), nn.ReLU(), nn.Linear(12, d))
                                      for e in range(n_experts)})
        self.n_experts = n_experts

    def forward(self, x):
        probs = F.softmax(self.router(x), -1)
        w, idx = torch.topk(probs, 2, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        load = []
        for e in range(self.n_experts):
            rows, slot = (idx == e).nonzero(as_tuple=True)
            load.append(rows.numel())
            if rows.numel() == 0:
                continue
            y = self.experts[f"e{e}"](x[rows]) * w[rows, slot].unsqueeze(-1)
            out.index_add_(0, rows, y)
        return MoEOut(out, load)


def moe_inputs(n):
    g = _gen(2)
    out = []
    for k in range(n):
        bias = torch.randn(1, 8, generator=g) * (3.0 if k % 2 else 0.2)
        out.append((bias + torch.randn(5, 8, generator=g),))
    return out


# --- beam search decode with a small beam ----------------------------------------------------

class BeamDecoder(nn.Module):
    """Beam search over a GRU cell: hypotheses in Python lists of (score, tokens, state),
    `torch.topk` per step, `.item()`/`.tolist()`, `sorted`, finished hypotheses moved out,
    `while True` with `continue` and `break`."""

    def __init__(self, vocab=7, d=12, beam=2, max_len=5, eos=0):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.cell = nn.GRUCell(d, d)
        self.out = nn.Linear(d, vocab)
        self.enc = nn.Linear(4, d)
        self.beam, self.max_len, self.eos = beam, max_len, eos

    def forward(self, src):
        h0 = torch.tanh(self.enc(src))
        beams = [(0.0, [1], h0)]
        finished = []
        step = 0
        while True:
            step += 1
            candidates = []
            for score, toks, h in beams:
                if toks[-1] == self.eos:
                    finished.append((score, toks))
                    continue
                h = self.cell(self.embed(torch.tensor([toks[-1]])), h)
                logp = F.log_softmax(self.out(h), -1)[0]
                top_v, top_i = torch.topk(logp, self.beam)
                for v, i in zip(top_v.tolist(), top_i.tolist()):
                    candidates.append((score + v, toks + [i], h))
            if not candidates:
                break
            beams = sorted(candidates, key=lambda c: c[0], reverse=True)[: self.beam]
            if step >= self.max_len:
                break
        finished += [(s, t) for s, t, _ in beams]
        best_score, best = max(finished, key=lambda f: f[0] / len(f[1]))
        return torch.tensor(best), best_score


def beam_inputs(n):
    g = _gen(3)
    return [(torch.randn(1, 4, generator=g) * 2,) for _ in range(n)]


# --- LayerDrop-style skipping driven by a gate network ---------------------------------------

@dataclass
class DropOut:
    logits: torch.Tensor
    kept: int
    gates: torch.Tensor


class GatedLayerDrop(nn.Module):
    """A gate network decides which of the layers run: `getattr(self, f"layer{i}")`,
    `continue` on a dropped layer, `any()` over a list of bool tensors, `max()` builtin over
    tensors, a `torch.tensor(1)` flag, a dataclass output."""

    def __init__(self, d=10, n=4):
        super().__init__()
        self.gate = nn.Linear(d, n)
        for i in range(n):
            setattr(self, f"layer{i}", nn.Sequential(nn.Linear(d, d), nn.Tanh()))
        self.n = n
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        gates = torch.sigmoid(self.gate(x))[0]
        keep = [g > 0.5 for g in gates]
        always = torch.tensor(1)
        if not any(keep):
            keep[0] = always.bool()
        kept = 0
        for i in range(self.n):
            if not keep[i]:
                continue
            x = getattr(self, f"layer{i}")(x)
            kept += 1
        strongest = max(gates[0], gates[-1])
        return DropOut(self.head(x) * strongest, kept, gates)


def layerdrop_inputs(n):
    g = _gen(4)
    return [(torch.randn(1, 10, generator=g) * 3,) for _ in range(n)]


# --- dynamic-depth RNN with halting per step --------------------------------------------------

def halting_step(cell, halt, x_t, h):
    h = cell(x_t, h)
    return h, torch.sigmoid(halt(h))


class HaltingRNN(nn.Module):
    """Per time step, the cell ponders until a halting unit fires (`while True` with an
    `.item()` test), at most `max_ponder` times; the step counts go into a Python list summed
    with numpy. A helper function, `x.shape[1]` loop bound, reused loop variable name."""

    def __init__(self, d_in=3, d=8, max_ponder=4):
        super().__init__()
        self.cell = nn.RNNCell(d_in, d)
        self.halt = nn.Linear(d, 1)
        self.out = nn.Linear(d, 2)
        self.max_ponder = max_ponder

    def forward(self, x):
        h = torch.zeros(x.shape[0], self.cell.hidden_size)
        steps = []
        for i in range(x.shape[1]):
            n = 0
            while True:
                h, p = halting_step(self.cell, self.halt, x[:, i], h)
                n += 1
                if p.item() > 0.5 or n >= self.max_ponder:
                    break
            steps.append(n)
        for i in range(1):  # the name `i` reused by a second loop
            h = h * 1.0
        return self.out(h), int(np.sum(steps)), steps


def halting_inputs(n):
    g = _gen(5)
    return [(torch.randn(1, 3, 3, generator=g) * 2,) for _ in range(n)]


# --- confidence cascade over an nn.ModuleDict of models --------------------------------------

class Cascade(nn.Module):
    """Models from cheap to expensive; the first whose top probability passes its threshold
    answers. `for name, m in self.models.items()`, per-model thresholds in a dict, `try/except`
    around nothing dynamic, code left after `return`, `sum()` of tensors, `min()` builtin."""

    def __init__(self, d=6, classes=4):
        super().__init__()
        self.models = nn.ModuleDict({
            "small": nn.Linear(d, classes),
            "medium": nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Linear(16, classes)),
            "large": nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, classes)),
        })
        self.thresholds = {"small": 0.7, "medium": 0.5}

    def forward(self, x):
        try:
            scale = 1.0 / x.shape[-1]
        except ZeroDivisionError:
            scale = 1.0
        spent = []
        for k, (name, m) in enumerate(self.models.items()):
            logits = m(x)
            conf = F.softmax(logits, -1).max()
            spent.append(conf * scale)
            if name in self.thresholds and conf > self.thresholds[name]:
                return logits, k, sum(spent)
                spent.clear()  # never reached
        return logits, len(self.models) - 1, min(sum(spent), torch.tensor(10.0))


def cascade_inputs(n):
    g = _gen(6)
    return [(torch.randn(1, 6, generator=g) * (0.3 + 3 * (k % 3)),) for k in range(n)]


# --- Mixture-of-Depths router with top-k capacity --------------------------------------------

class MixtureOfDepths(nn.Module):
    """Per block, a router picks the top `capacity` tokens (`torch.topk`), the block runs on
    those only and its output is scattered back (`scatter_add_` into a clone); a branch on
    `x.shape[0]`; a list comprehension over the blocks' capacities; in-place update through an
    alias."""

    def __init__(self, d=8, n_blocks=3, capacity=0.5):
        super().__init__()
        self.blocks = nn.ModuleList([TinyBlock(d) for _ in range(n_blocks)])
        self.routers = nn.ModuleList([nn.Linear(d, 1) for _ in range(n_blocks)])
        self.capacity = capacity
        self.head = nn.Linear(d, 2)

    def forward(self, x):
        b, t, d = x.shape
        ks = [max(1, int(self.capacity * t)) for _ in self.blocks]
        chosen = []
        for block, router, k in zip(self.blocks, self.routers, ks):
            scores = router(x).squeeze(-1)
            top = torch.topk(scores, k, dim=1).indices.sort(dim=1).values
            idx = top.unsqueeze(-1).expand(b, k, d)
            picked = x.gather(1, idx)
            delta = (block(picked) - picked) * torch.sigmoid(scores.gather(1, top)).unsqueeze(-1)
            y = x.clone()
            alias = y
            alias.scatter_add_(1, idx, delta)
            x = y
            chosen.append(top)
        if x.shape[0] > 1:
            pooled = x.mean((0, 1))[None]
        else:
            pooled = x.mean(1)
        return self.head(pooled), torch.stack(chosen, 0)


def mod_inputs(n):
    g = _gen(7)
    return [(torch.randn(1, 6, 8, generator=g),) for _ in range(n)]


MODELS = {  # name -> (class, inputs(n))
    "calm": (CALM, calm_inputs), "top2_moe": (Top2MoE, moe_inputs), "beam": (BeamDecoder, beam_inputs),
    "layerdrop": (GatedLayerDrop, layerdrop_inputs), "halting_rnn": (HaltingRNN, halting_inputs),
    "cascade": (Cascade, cascade_inputs), "mixture_of_depths": (MixtureOfDepths, mod_inputs),
}


def main(argv: list[str]) -> None:
    """`python tests/research_styles.py [names] [hosts] [n]`: convert each model on each host and
    compare `jm(...)` and `jm.trace(...)` with the original model on `n` inputs (the test file
    runs the cheap ones; this runs the whole table, minutes per model on a loaded machine)."""
    import dataclasses
    import time

    import dycl_jax
    from differential import assert_same
    from dycl_jax.errors import DyclError

    def plain(o):
        return dataclasses.asdict(o) if dataclasses.is_dataclass(o) else tuple(o) if hasattr(o, "_fields") else o

    names = argv[0].split(",") if argv else list(MODELS)
    hosts = argv[1].split(",") if len(argv) > 1 else ["auto", "staged", "dispatch"]
    n = int(argv[2]) if len(argv) > 2 else 12
    for name in names:
        cls, make_inputs = MODELS[name]
        for host in hosts:
            torch.manual_seed(0)
            model, inputs, start = cls().eval(), make_inputs(n), time.time()
            try:
                jm = dycl_jax.to_jax(model, inputs[0], host=host)
            except DyclError as exc:
                print(f"{name} {host}: refused: {str(exc).splitlines()[0]} at {exc.location}", flush=True)
                continue
            bad = 0
            for k, args in enumerate(inputs):
                with torch.no_grad():
                    want = model(*args)
                try:
                    assert type(jm(*args)) is type(want) or isinstance(want, torch.Tensor)
                    assert_same(plain(want), plain(jm(*args)), f"input {k}")
                    assert_same(plain(want), plain(jm.trace(*args)[0]), f"input {k} (trace)")
                except AssertionError as exc:
                    bad += 1
                    print(f"  mismatch: {str(exc)[:300]}")
            print(f"{name} {host}: ran on {jm.host}, {len(inputs) - bad}/{len(inputs)} matched, "
                  f"{time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    main(sys.argv[1:])
