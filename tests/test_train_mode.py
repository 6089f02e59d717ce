"""`to_jax(..., train=True)`: BatchNorm on batch statistics with its running statistics
returned as a state update, and random ops drawing from a key; compared with the ORIGINAL
torch module in training mode over several steps, on every path of an early exit and a
skipped block."""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from flax import nnx

import dycl_jax
from dycl_jax.errors import CallError, DyclError

DIM = 6


class GatedExitNet(nn.Module):
    """A stem with BatchNorm and dropout, a block skipped when its gate says so (BatchNorm
    inside), an early exit, and a deep head whose BatchNorm runs only on the late path."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(DIM, DIM), nn.BatchNorm1d(DIM), nn.ReLU())
        self.drop = nn.Dropout(p)
        self.gate = nn.Linear(DIM, 1)
        self.block = nn.Sequential(nn.Linear(DIM, DIM), nn.BatchNorm1d(DIM, momentum=None), nn.Tanh())
        self.exit = nn.Linear(DIM, 3)
        self.deep = nn.Sequential(nn.Linear(DIM, DIM), nn.BatchNorm1d(DIM), nn.ReLU(), nn.Linear(DIM, 3))

    def forward(self, x):
        h = self.stem(x)
        if self.training:
            h = self.drop(h)
        if self.gate(x).mean() > 0:  # the gate reads the raw input, far from its threshold
            h = h + self.block(h)
        out = self.exit(h)
        if x.mean() > 0.5:
            return out, 0
        return self.deep(h) + out, 1


def _inputs():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(8, DIM, generator=g)
    # (early exit, late) x (gate open, gate shut): the gate's sign follows the shift along w
    return base


def _shifted(model, base, gate_open, early):
    w = model.gate.weight.detach()[0]
    x = base - base.mean(0, keepdim=True) + (2.0 if gate_open else -2.0) * w / w.norm() ** 2
    # moving along a direction orthogonal to w changes the mean without touching the gate
    u = torch.ones(DIM) - (torch.ones(DIM) @ w) / w.norm() ** 2 * w
    need = (1.5 if early else -0.5) - x.mean()
    return x + need / u.mean() * u


def _buffers(jm_state) -> dict[str, np.ndarray]:
    return {".".join(map(str, p)): np.asarray(v.get_raw_value()) for p, v in jm_state.flat_state()
            if isinstance(v, nnx.BatchStat)}


def _assert_stats_match(jm, ref, step) -> None:
    """Every buffer of the torch twin against jm's statistics: counts exact, floats within 1e-5."""
    got = _buffers(nnx.state(jm.module))
    for name, buf in ref.named_buffers():
        if buf.dtype == torch.int64:
            assert int(got[name]) == int(buf), (step, name)
        else:
            np.testing.assert_allclose(got[name], buf.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"{step} {name}")


def _fresh(cls=GatedExitNet, **kw):
    torch.manual_seed(0)
    model = cls(**kw)
    twin = cls(**kw)
    twin.load_state_dict(model.state_dict())
    return model, twin.train()


def test_batchnorm_statistics_and_outputs_match_torch_over_steps_on_every_path():
    model, ref = _fresh()
    base = _inputs()
    model.eval()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    jm = dycl_jax.to_jax(model, (base,), train=True)
    assert jm.host == "staged" and not model.training  # the user's model is left as it was
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    assert set(jm.updated_paths) == {f"{m}.{b}" for m in ("stem.1", "block.1", "deep.1")
                                     for b in ("running_mean", "running_var", "num_batches_tracked")}
    seen = set()
    for step, (gate_open, early) in enumerate([(True, True), (False, False), (True, False), (False, True),
                                               (True, False)]):
        x = _shifted(model, base + 0.1 * step, gate_open, early)
        want_out, want_exit = ref(x)
        got_out, got_exit = jm(x.numpy())
        assert int(got_exit) == want_exit == (0 if early else 1)
        np.testing.assert_allclose(np.asarray(got_out), want_out.detach().numpy(), rtol=1e-4, atol=1e-5)
        _assert_stats_match(jm, ref, step)
        seen.add((gate_open, early))
        _, decisions = jm.trace(x.numpy())  # the gate's and the exit's decisions, statistics untouched
        assert [v for _, v in decisions] == [gate_open, early]
        assert int(_buffers(nnx.state(jm.module))["stem.1.num_batches_tracked"]) == step + 1
    assert len(seen) == 4
    assert int(ref.block[1].num_batches_tracked) == 3 and int(ref.deep[1].num_batches_tracked) == 3
    # the pure form: the module is left alone, the new statistics come back in the new state
    state = nnx.state(jm.module)
    before = _buffers(state)
    x = _shifted(model, base, True, False)
    (out, _), new_state = jax.jit(jm.apply)(state, x.numpy(), key=jax.random.key(1))
    assert all(np.array_equal(v, before[k]) for k, v in _buffers(nnx.state(jm.module)).items())
    np.testing.assert_allclose(np.asarray(out), ref(x)[0].detach().numpy(), rtol=1e-4, atol=1e-5)
    new = _buffers(new_state)
    for name, buf in ref.named_buffers():
        np.testing.assert_allclose(new[name], buf.numpy().astype(new[name].dtype), rtol=1e-5, atol=1e-6, err_msg=name)


class Noisy(nn.Module):
    """Dropout at the top level and inside a branch, and the other random factories."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x, probs):
        y = F.dropout(x, self.p, self.training)
        if x.sum() > 0:
            z = F.dropout(x * 2, self.p, self.training)
        else:
            z = x
        return (y, z, torch.bernoulli(torch.full_like(x, 0.25)), torch.rand(4000), torch.randn_like(x),
                torch.normal(torch.full_like(x, 3.0), 2.0), torch.multinomial(probs, 3),
                torch.multinomial(probs, 4000, replacement=True))


def test_random_ops_statistics_and_keys():
    p, n = 0.3, 20000
    x = torch.ones(2, n // 2)
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.7, 0.1, 0.1, 0.1]])
    jm = dycl_jax.to_jax(Noisy(p), (x, probs), train=True)
    k1, k2 = jax.random.key(1), jax.random.key(2)
    outs = [np.asarray(o) for o in jm(x.numpy(), probs.numpy(), key=k1)]
    y, z, bern, uni, gauss, normal, pick, draws = outs
    # keep rate 0.7 within 0.015 (about 4.6 standard deviations over 20000 elements), kept values scaled 1/(1-p)
    for mask_src, scale in ((y, 1.0), (z, 2.0)):
        kept = mask_src != 0
        assert abs(kept.mean() - (1 - p)) < 0.015
        np.testing.assert_allclose(mask_src[kept], scale / (1 - p), rtol=1e-6)
    assert not np.array_equal(y != 0, z != 0)  # two dropouts, two masks
    assert abs(bern.mean() - 0.25) < 0.015 and set(np.unique(bern)) == {0.0, 1.0}
    assert abs(uni.mean() - 0.5) < 0.03 and uni.min() >= 0 and uni.max() < 1
    assert abs(gauss.mean()) < 0.04 and abs(gauss.std() - 1) < 0.03
    assert abs(normal.mean() - 3) < 0.08 and abs(normal.std() - 2) < 0.06
    assert pick.shape == (2, 3) and all(len(set(row)) == 3 for row in pick)  # without replacement
    freq = np.stack([np.bincount(row, minlength=4) / row.size for row in draws])
    np.testing.assert_allclose(freq, probs.numpy(), atol=0.035)
    again = [np.asarray(o) for o in jm(x.numpy(), probs.numpy(), key=k1)]
    assert all(np.array_equal(a, b) for a, b in zip(outs, again))  # same key, same draws
    other = np.asarray(jm(x.numpy(), probs.numpy(), key=k2)[0])
    assert (other != 0).mean() > 0.6 and ((other != 0) != (y != 0)).mean() > 0.3  # another key, another mask
    # without a key each call takes the next key of jm.rngs
    a, b = (np.asarray(jm(x.numpy(), probs.numpy())[0]) for _ in range(2))
    assert not np.array_equal(a != 0, b != 0)
    with pytest.raises(CallError, match="key"):
        jm.apply(nnx.state(jm.module), x.numpy(), probs.numpy())


class Sampler(nn.Module):
    def forward(self, x):
        return x + torch.randn_like(x)


def test_random_ops_in_an_eval_conversion_are_a_located_error_and_max_len_is_refused():
    """For inference the staged host refuses a random op, located; auto runs it in torch on the
    dispatch host (listed in the report); train=True refuses max_len (the dispatch host's train
    mode: test_dispatch_train.py)."""
    with pytest.raises(DyclError) as err:
        dycl_jax.to_jax(Sampler().eval(), (torch.ones(2, 3),), host="staged")
    assert "train=True" in err.value.fix and err.value.location.file == __file__
    jm = dycl_jax.to_jax(Sampler().eval(), (torch.ones(2, 3),))
    assert jm.host == "dispatch" and "randn_like" in jm.report().host_statements[0]
    with pytest.raises(DyclError, match="max_len"):
        dycl_jax.to_jax(GatedExitNet(), (torch.ones(4, DIM),), train=True, max_len=4)


class RefinedNorm(nn.Module):
    """As many refinement steps as the first feature says (a tensor `while`, a BatchNorm on
    each path of a branch in its body), then an if/elif/else of heads, the first holding a
    branch of its own."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(DIM)
        self.odd = nn.BatchNorm1d(DIM)
        self.heads = nn.ModuleList([nn.Sequential(nn.Linear(DIM, DIM), nn.BatchNorm1d(DIM)) for _ in range(2)])
        self.inner = nn.BatchNorm1d(DIM, momentum=None)

    def forward(self, x):
        steps = x[:, 0].mean()
        score = x[:, 1].mean()
        n = 0
        while n < steps and n < 3:
            if n % 2 == 0:
                x = x + 0.5 * self.bn(x)
            else:
                x = self.odd(x) - 0.5
            n += 1
        if score > 1:
            y = self.heads[0](x)
            if steps > 2:
                y = self.inner(y) * 2
        elif score > 0:
            y = self.heads[1](x)
        else:
            y = x - 1
        return y, n


class ChainedNorm(nn.Module):
    """Early returns in a row (an elif chain once rewritten), BatchNorms on two of its paths."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(DIM)
        self.bn2 = nn.BatchNorm1d(DIM)

    def forward(self, x):
        if x.mean() > 1:
            return x
        if x.mean() > 0:
            return self.bn(x) * 2
        return self.bn2(x) + 1


# (steps, score) per call: loop trip counts 0, 1, 2, 3 and the bound; every head, both inner paths
_REFINED = [(-1.0, 2.0), (0.5, 0.5), (1.5, -1.0), (2.5, 2.0), (9.0, 0.5), (1.5, 2.0), (2.5, 2.0)]
_CHAINED = [(0.0, 2.0), (0.0, 0.5), (0.0, -1.0), (0.0, 0.5), (0.0, -1.0)]


@pytest.mark.parametrize("cls,calls", [(RefinedNorm, _REFINED), (ChainedNorm, _CHAINED)])
def test_batchnorm_in_loops_elif_chains_and_nested_branches_matches_torch(cls, calls):
    """Running statistics updated inside a `while` body (a loop carry), an elif chain and nested
    branches (an output of every level; the untaken paths pass the old values through)."""
    model, ref = _fresh(cls)
    g = torch.Generator().manual_seed(5)
    x0 = torch.randn(8, DIM, generator=g)
    jm = dycl_jax.to_jax(model, (x0,), train=True)
    assert jm.host == "staged" and {p.rsplit(".", 1)[0] for p in jm.updated_paths} == {
        n.rsplit(".", 1)[0] for n, _ in ref.named_buffers()}
    for step, (steps, score) in enumerate(calls):
        x = torch.randn(8, DIM, generator=g)
        x[:, 0] += steps - x[:, 0].mean()
        x[:, 1] += score - x[:, 1].mean()
        if cls is ChainedNorm:
            x += score - x.mean()
        want = ref(x)
        got = jm(x.numpy())
        if cls is RefinedNorm:
            assert int(got[1]) == want[1] == (0 if steps < 0 else min(3, int(steps) + 1))
            want, got = want[0], got[0]
        np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-4, atol=1e-4, err_msg=str(step))
        _assert_stats_match(jm, ref, step)
    counts = {n: int(b) for n, b in ref.named_buffers() if n.endswith("num_batches_tracked")}
    if cls is RefinedNorm:  # every statistic moved, by the trip counts 0, 1, 2, 3, 3, 2, 3 (even, odd steps)
        assert counts == {"bn.num_batches_tracked": 9, "odd.num_batches_tracked": 5,
                          "heads.0.1.num_batches_tracked": 4, "heads.1.1.num_batches_tracked": 2,
                          "inner.num_batches_tracked": 2}
    else:
        assert counts == {"bn.num_batches_tracked": 2, "bn2.num_batches_tracked": 2}


class LoopDrop(nn.Module):
    """Dropout inside a branch inside a tensor-dependent while loop: each iteration, and each
    call, must draw its own mask."""

    def forward(self, x):
        acc = torch.zeros_like(x)
        n = x.sum() * 0
        while n < 2:
            if x.mean() > 0:
                acc = acc + F.dropout(x, 0.5, self.training)
            else:
                acc = acc - x
            n = n + 1
        return acc


def test_each_loop_iteration_and_each_call_draws_its_own_mask():
    x = torch.ones(4, 2500)
    jm = dycl_jax.to_jax(LoopDrop(), (x,), train=True)
    acc = np.asarray(jm(x.numpy(), key=jax.random.key(3)))
    # kept values are exactly 1/(1-p) = 2 each iteration, kept at rate 1-p = 0.5: two independent
    # masks give 4 / 2 / 0 on about 1/4, 1/2, 1/4 of the elements (one mask drawn twice: 0 and 4 only)
    assert set(np.unique(acc)) == {0.0, 2.0, 4.0}
    for value, rate in ((4.0, 0.25), (2.0, 0.5), (0.0, 0.25)):
        assert abs((acc == value).mean() - rate) < 0.02, value
    assert np.array_equal(acc, np.asarray(jm(x.numpy(), key=jax.random.key(3))))  # same key, same masks
    other = np.asarray(jm(x.numpy(), key=jax.random.key(4)))
    calls = [np.asarray(jm(x.numpy())) for _ in range(2)]  # no key: the next one of jm.rngs
    for a, b in ((acc, other), tuple(calls)):
        assert ((a == 2) != (b == 2)).mean() > 0.3
    np.testing.assert_array_equal(np.asarray(jm(-x.numpy())), 2 * np.ones_like(acc))  # the other branch
