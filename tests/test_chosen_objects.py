"""Statements that change an object chosen at run time: `(done if t else beams).append(c)`,
`target = done if t else beams; target.append(c)`, `if t: a = v` then `a.add_(1)`, items
stored into a chosen dict. torch changes the chosen object; a converted construct's output is a
new one. Each model is matched against the ORIGINAL torch model on every host that converts it
(ints exactly, floats within 1e-5 relative and 1e-6 absolute), and host="staged" either matches
or refuses with a located error, never answers differently."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dycl_jax
from dycl_jax.errors import DyclError

XS = [torch.tensor([[0.5, -1.0, 2.0, 0.1]]), -torch.ones(1, 4), torch.tensor([[3.0, 0.2, -0.7, -2.0]]),
      torch.tensor([[-0.3, 1.5, 0.4, -0.1]])]


class Scored(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        with torch.no_grad():  # a fixed layer, so every input takes the path its signs say
            self.lin.weight.copy_(torch.eye(4))
            self.lin.bias.zero_()


class ChosenListAppend(Scored):
    """A tensor test chooses the list a value is appended to."""

    def forward(self, x):
        h = self.lin(x)
        done, beams = [], []
        for j in range(4):
            (done if h[0, j] > 0 else beams).append(h[0, j] * 2)
        return len(done), len(beams), sum(done) if done else h.sum() * 0


class ChosenGroup(Scored):
    """An `.item()`-style index chooses the inner list: `groups[int(t)].append(...)`."""

    def forward(self, x):
        h = self.lin(x)
        groups = [[], []]
        for j in range(4):
            groups[int(h[0, j] > 0)].append(h[0, j] * 2)
        return len(groups[0]), len(groups[1]), torch.stack(groups[1]).sum() if groups[1] else h.sum() * 0


class OrUpdate(Scored):
    """`(b or a).add_(1)`: b is None, so torch updates a."""

    def forward(self, x):
        h = self.lin(x)
        a = h * 1.0
        b = None
        if h.sum() > 0:
            (b or a).add_(1.0)
        return a, h


class ChosenTarget(Scored):
    """`target = done if t else beams`, then `target.append(...)`."""

    def forward(self, x):
        h = self.lin(x)
        done, beams = [], []
        for j in range(4):
            target = done if h[0, j] > 0 else beams
            target.append(h[0, j])
        return len(done), len(beams)


class ChosenTensor(Scored):
    """`t = a if c else b`, then `t.add_(1)`: torch's a or b changes."""

    def forward(self, x):
        h = self.lin(x)
        a = h * 1.0
        b = h * 2.0
        t = a if h.sum() > 0 else b
        t.add_(1.0)
        return a, b


class ChosenTensorUpdated(Scored):
    """`(a if c else b).add_(1)`: one staged `cond`, each branch updating its own tensor."""

    def forward(self, x):
        h = self.lin(x)
        a = h * 1.0
        b = h * 2.0
        (a if h.sum() > 0 else b).add_(1.0)
        return a, b


class AliasMadeInBranch(Scored):
    """`if t: a = v`, then `a.add_(1)`: on that path torch's v changes too."""

    def forward(self, x):
        h = self.lin(x)
        a = h * 1.0
        v = h * 2.0
        if h.sum() > 0:
            a = v
        a.add_(1.0)
        return a, v


class TargetMadeInBranch(Scored):
    """The statement form of ChosenTarget, with a flag built as `torch.tensor(...)` beside it."""

    def forward(self, x):
        h = self.lin(x)
        done, beams = [], []
        hits = torch.tensor(0)
        for j in range(4):
            if h[0, j] > 0:
                target = done
                hits = hits + 1
            else:
                target = beams
            target.append(h[0, j])
        return len(done), len(beams), hits


class ChosenDict(Scored):
    """Items stored into a dict a tensor test chooses."""

    def forward(self, x):
        h = self.lin(x)
        pos, neg = {}, {}
        for j in range(4):
            (pos if h[0, j] > 0 else neg)[j] = h[0, j]
        return len(pos), sum(pos.values()) if pos else h.sum() * 0


class DictOfViews(Scored):
    """Per-column values (views of h) stored into dicts in a branch: a store changes the dict,
    not the tensor, so the dispatch host keeps them."""

    def forward(self, x):
        h = self.lin(x)
        pos, neg = {}, {}
        for j in range(4):
            if h[0, j] > 0:
                pos[j] = h[0, j]
            else:
                neg[j] = h[0, j]
        return len(pos), sum(pos.values()) if pos else h.sum() * 0


class Beams(nn.Module):
    """Beam search over Python lists of (score, tokens, state), finished hypotheses sorted
    into `done` by `(done if tokens[-1] == eos else beams).append(c)`."""

    def __init__(self, beam: int = 2, steps: int = 4, eos: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(6, 4)
        self.cell = nn.GRUCell(4, 4)
        self.out = nn.Linear(4, 6)
        self.beam, self.steps, self.eos = beam, steps, eos

    def forward(self, x):
        beams, done = [(0.0, [0], torch.tanh(x))], []
        for _ in range(self.steps):
            cand = []
            for score, toks, h in beams:
                h2 = self.cell(self.emb(torch.tensor([toks[-1]])), h)
                top, idx = F.log_softmax(self.out(h2), -1)[0].topk(self.beam)
                for lp, t in zip(top.tolist(), idx.tolist()):
                    cand.append((score + lp, toks + [t], h2))
            cand.sort(key=lambda c: -c[0])
            beams = []
            for c in cand[:self.beam]:
                (done if c[1][-1] == self.eos else beams).append(c)
            if not beams:
                break
        best = max(done + beams, key=lambda c: c[0])
        return torch.tensor(best[1]), best[0], len(done)


MODELS = [ChosenListAppend, ChosenGroup, OrUpdate, ChosenTarget, ChosenTensor, ChosenTensorUpdated,
          AliasMadeInBranch, TargetMadeInBranch, ChosenDict, DictOfViews, Beams]


def _leaves(x):
    return [leaf for v in x for leaf in _leaves(v)] if isinstance(x, (tuple, list)) else [x]


def _assert_matches(model: nn.Module, jm, xs) -> None:
    for x in xs:
        with torch.no_grad():
            want = _leaves(model(x.clone()))
        got = _leaves(jm(x.clone()))
        assert len(got) == len(want)
        for w, g in zip(want, got):
            w = w.numpy() if isinstance(w, torch.Tensor) else np.asarray(w)
            g = np.asarray(g)
            assert g.shape == w.shape
            if w.dtype.kind == "f":
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
            else:
                np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("host", ["auto", "dispatch"])
@pytest.mark.parametrize("cls", MODELS, ids=lambda c: c.__name__)
def test_the_chosen_object_changes_as_in_torch(cls, host):
    model = cls().eval()
    xs = XS
    jm = dycl_jax.to_jax(model, (xs[0].clone(),), host=host)
    _assert_matches(model, jm, xs)


@pytest.mark.parametrize("cls", MODELS, ids=lambda c: c.__name__)
def test_the_staged_host_matches_or_refuses_at_the_users_line(cls):
    model = cls().eval()
    xs = XS
    try:
        jm = dycl_jax.to_jax(model, (xs[0].clone(),), host="staged")
    except DyclError as exc:
        assert exc.location is not None and exc.location.file == __file__, exc
        return
    _assert_matches(model, jm, xs)


def test_an_update_through_either_arm_stays_one_staged_program():
    jm = dycl_jax.to_jax(ChosenTensorUpdated().eval(), (XS[0],))
    assert jm.host == "staged"
