"""Training-mode artifacts: `to_jax(..., train=True)` exported (staged and dispatch hosts) and run
where torch cannot be imported, with a key argument, against the ORIGINAL torch model in training
mode: outputs and updated BatchNorm statistics, decisions, and the same key giving the same
dropout mask."""
from __future__ import annotations

import importlib.util

import jax
import pytest
import numpy as np
import torch

import dycl_jax
import torch_free  # tests/: a subprocess where torch cannot be imported
from test_train_mode import DIM, _fresh, _inputs, _shifted  # pytest puts tests/ on sys.path

# per job: load, then call with each (inputs, key seed) in turn (statistics carried between calls)
RUNNER = """
import jax
import pytest
import numpy as np
import dycl_jax
for name, (path, calls) in jobs.items():
    model = dycl_jax.load(path)
    runs = []
    for args, seed in calls:
        (y, exit_), stats = model(*args, key=jax.random.key(seed) if seed % 2 else seed)
        runs.append((np.asarray(y), int(exit_), {k: np.asarray(v) for k, v in stats.items()}))
    _, decisions = model.trace(*calls[0][0], key=0)
    out[name] = (runs, [tuple(d) for d in decisions])
    try:
        model(*calls[0][0])
        out[name + " no key"] = None
    except dycl_jax.DyclError as err:
        out[name + " no key"] = type(err).__name__
"""


def test_train_artifact_matches_torch_statistics_and_keys(tmp_path) -> None:
    model, ref = _fresh()  # ref: the torch twin in training mode, dropout p=0
    base = _inputs()
    jm = dycl_jax.to_jax(model.eval(), (base,), train=True)
    assert jm.host == "staged"
    manifest = jm.export(str(tmp_path / "p0"))
    assert manifest["train"]["updated"] == jm.updated_paths
    # dropout p=0.5: the same artifact program with a random mask
    noisy, _ = _fresh(p=0.5)
    jn = dycl_jax.to_jax(noisy.eval(), (base,), train=True)
    jn.export(str(tmp_path / "p5"))
    paths = [(True, True), (False, False), (True, False)]
    calls = [((_shifted(model, base + 0.1 * k, g, e).numpy(),), k) for k, (g, e) in enumerate(paths)]
    x = calls[0][0]
    noisy_calls = [(x, 3), (x, 3), (x, 4)]  # a typed key twice, then another one
    out = torch_free.run(tmp_path, RUNNER, {"p0": (str(tmp_path / "p0"), calls),
                                            "p5": (str(tmp_path / "p5"), noisy_calls)})
    assert out["torch loaded"] == [] and out["p0 no key"] == "CallError"
    runs, decisions = out["p0"]
    for k, ((args, _), (y, exit_, stats)) in enumerate(zip(calls, runs)):
        want_y, want_exit = ref(torch.from_numpy(args[0]))  # torch in training mode, statistics updated
        assert exit_ == want_exit == (0 if paths[k][1] else 1), k
        np.testing.assert_allclose(y, want_y.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=f"call {k}")
        buffers = dict(ref.named_buffers())
        assert set(stats) == set(jm.updated_paths)
        for name, value in stats.items():  # counts exactly, floats within 1e-5
            want = buffers[name].numpy()
            if want.dtype == np.int64:
                assert int(value) == int(want), (k, name)
            else:
                np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-5, err_msg=f"call {k} {name}")
    # the traced program reports the gate's and the exit's decisions (statistics left alone)
    assert [v for _, v in decisions] == [True, True]
    (a, _, sa), (b, _, sb), (c, _, _) = out["p5"][0]
    assert np.array_equal(a, b) and not np.array_equal(a, c)  # the same key, the same mask
    # the artifact keeps its statistics between calls: the second call saw the first's update
    assert int(sb["stem.1.num_batches_tracked"]) == int(sa["stem.1.num_batches_tracked"]) + 1 == 2


class HostGated(torch.nn.Module):
    """A gate read on the host (`.item()`: the dispatch host), dropout p=0 and a BatchNorm on
    both paths, a second BatchNorm only on the gated one."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(DIM)
        self.drop = torch.nn.Dropout(0.0)
        self.deep = torch.nn.Sequential(torch.nn.Linear(DIM, DIM), torch.nn.BatchNorm1d(DIM))

    def forward(self, x):
        h = self.drop(self.norm(x))
        if x.sum().item() > 0:
            h = self.deep(h)
        return h


DISPATCH_RUNNER = """
import jax
import pytest
import numpy as np
import dycl_jax
model = dycl_jax.load(jobs["path"])
runs = []
for x, seed in jobs["calls"]:
    y, stats = model(x, key=seed)
    runs.append((np.asarray(y), {k: np.asarray(v) for k, v in stats.items()}))
out["runs"] = runs
out["decisions"] = [[(d[0], d[1], d.margin) for d in model.trace(x, key=1)[1]] for x, _ in jobs["calls"][:2]]
"""


def test_train_artifact_of_the_dispatch_host_matches_torch_statistics_and_decisions(tmp_path) -> None:
    """Exported after both paths ran: outputs and updated statistics of every call against torch's
    training mode (each call reading the last one's statistics), decisions as `jm.trace`'s."""
    model, ref = _fresh(HostGated)
    base = _inputs()
    up, down = base - base.mean() + 0.5, base - base.mean() - 0.5
    jm = dycl_jax.to_jax(model.eval(), (up,), train=True, host="dispatch")
    jm(down.numpy(), key=jax.random.key(0))  # the other path compiled; its statistics kept, as in torch
    with torch.no_grad():
        ref(down)
    want_decisions = [jm.trace(x.numpy(), key=jax.random.key(1))[1] for x in (up, down)]
    manifest = jm.export(str(tmp_path / "d"))
    assert manifest["train"]["updated"] == jm.updated_paths
    calls = [(x.numpy(), seed) for seed, x in enumerate((up, down, up + 0.1))]
    out = torch_free.run(tmp_path, DISPATCH_RUNNER, {"path": str(tmp_path / "d"), "calls": calls})
    assert out["torch loaded"] == []
    for k, ((x, _), (y, stats)) in enumerate(zip(calls, out["runs"])):
        with torch.no_grad():
            want = ref(torch.from_numpy(x))  # torch in training mode, statistics updated
        np.testing.assert_allclose(y, want.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"call {k}")
        buffers = dict(ref.named_buffers())
        assert set(stats) == set(buffers)
        for name, value in stats.items():  # counts exactly, floats within 1e-5
            if buffers[name].dtype == torch.int64:
                assert int(value) == int(buffers[name]), (k, name)
            else:
                np.testing.assert_allclose(value, buffers[name].numpy(), rtol=1e-5, atol=1e-5, err_msg=f"{k} {name}")
    last = out["runs"][-1][1]  # down before export (the gated BatchNorm skipped), then up, down, up
    assert (int(last["norm.num_batches_tracked"]), int(last["deep.1.num_batches_tracked"])) == (4, 2)
    for got, want in zip(out["decisions"], want_decisions):
        assert [(d[0], d[1]) for d in got] == [(d.site, d.value) for d in want] != []
        np.testing.assert_allclose([d[2] for d in got], [d.margin for d in want], rtol=1e-5)


class HostDropout(torch.nn.Module):
    """Dropout p=0.5 before an `.item()` branch on the host and again inside its gated arm."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(DIM, 32)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        h = self.drop(torch.relu(self.fc(x)))
        if x.sum().item() > 0:
            h = self.drop(h) * 2
        return h


DROPOUT_RUNNER = """
import jax
import pytest
import numpy as np
import dycl_jax
model = dycl_jax.load(jobs["path"])
out["runs"] = [np.asarray(model(x, key=jax.random.key(seed))[0]) for x, seed in jobs["calls"]]
"""


def test_dropout_of_the_dispatch_host_artifact_draws_as_jm_with_the_same_key(tmp_path) -> None:
    """p=0.5 on both paths: the artifact given a key gives jm's result for that key, another key
    another mask; against the ORIGINAL torch model (dropout off), kept units are its values
    scaled by 1/(1-p) per dropout and the dropped fraction is 1-(1-p)^n within 4 sigma."""
    torch.manual_seed(0)
    model = HostDropout()
    g = torch.Generator().manual_seed(5)
    base = torch.randn(32, DIM, generator=g)
    up, down = base - base.mean() + 0.5, base - base.mean() - 0.5
    jm = dycl_jax.to_jax(model.eval(), (up,), train=True, host="dispatch")
    calls = [(up.numpy(), 1), (up.numpy(), 1), (up.numpy(), 2), (down.numpy(), 3)]
    live = [np.asarray(jm(x, key=jax.random.key(seed))) for x, seed in calls]
    jm.export(str(tmp_path / "d"))
    out = torch_free.run(tmp_path, DROPOUT_RUNNER, {"path": str(tmp_path / "d"), "calls": calls})
    assert out["torch loaded"] == []
    for k, ((x, _), got, want) in enumerate(zip(calls, out["runs"], live)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, err_msg=f"call {k} (artifact vs jm, same key)")
        with torch.no_grad():
            plain = torch.relu(model.fc(torch.from_numpy(x))).numpy()  # the original model, dropout off
        drops, gain = (2, 2 * 4.0) if x.sum() > 0 else (1, 2.0)
        alive = plain > 0
        kept = got[alive] != 0
        np.testing.assert_allclose(got[alive][kept], plain[alive][kept] * gain, rtol=1e-5, atol=1e-6, err_msg=f"call {k}")
        assert np.all(got[~alive] == 0), k
        rate, n = 1 - 0.5 ** drops, alive.sum()
        assert abs((1 - kept.mean()) - rate) < 4 * np.sqrt(rate * (1 - rate) / n), (k, 1 - kept.mean(), rate)
    assert np.array_equal(out["runs"][0], out["runs"][1]) and not np.array_equal(out["runs"][0], out["runs"][2])


def test_a_dispatch_train_mode_model_emits_what_jm_runs(tmp_path) -> None:
    # (an AttributeError before the refusal that stood here: the host's function is a
    # functools.partial); the emitted module on both paths of the host gate, against jm
    jm = dycl_jax.to_jax(HostGated().eval(), (_inputs(),), train=True, host="dispatch")
    assert "def region_key()" in jm.to_source()
    spec = importlib.util.spec_from_file_location("emitted_host_gated_train", jm.emit(str(tmp_path / "m")))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    emitted = module.load()
    for sign in (1.0, -1.0):
        x = np.abs(_inputs().numpy()) * sign
        np.testing.assert_allclose(np.asarray(emitted(x, key=jax.random.key(3))),
                                   np.asarray(jm(x, key=jax.random.key(3))), rtol=1e-5, atol=1e-6)
