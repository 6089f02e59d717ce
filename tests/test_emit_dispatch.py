"""Emitted Flax source of dispatch-host models: the host's control flow as Python `__call__`s, its
regions as jitted methods. Imported where torch cannot be and compared on every input with the
original torch model and with `jm` (which ran those inputs before emitting)."""
from __future__ import annotations

import importlib
import re
import importlib.util

import numpy as np
import pytest
import torch

import dycl_jax
from emit_jobs import run_emitted  # tests/: one torch-free subprocess for every module
import converted  # tests/: the example conversions this process made already
from examples.dynn import DISPATCH_MODELS, PADDED_MODELS
from dycl_jax.emit import hosted
from differential import assert_same
from test_emit import _cases, compare
from test_list_identity import NumpyWhile

# (example, inputs, paths the inputs take at least): an `.item()` early exit with a numpy fallback,
# top-1 MoE with `nonzero` and `continue`, and every other example the dispatch host runs by default
# (captioning_teacher: its `.tolist()` host statement in numpy, the lengths it gives baked into the
# graphs after it, one version per lengths list; two inputs, as each runs ~10 region signatures)
CASES = [("numpy_fallback", 12, 3), ("moe", 8, 3), ("shape_branch", 8, 2), ("skip_logging", 8, 3),
         ("greedy_nmt", 8, 3), ("captioning", 8, 3), ("captioning_teacher", 2, 2)]
# (skipnet_ff under host="dispatch", its whole forward one island whose graph calls blocks whose
# host methods never ran, is emitted in train mode by test_dispatch_train.py)
MIN_PATHS = {name: k for name, _, k in CASES}
# a signature its host served by a program over symbolic ints is captured again with them constant
# (moe: `expert_idx == e`, the tensor work of its `nonzero` read, takes the expert number `e` as one)
CAPTURED_AGAIN = {"captioning", "captioning_teacher", "moe"}


@pytest.fixture(scope="module")
def emitted(tmp_path_factory) -> dict:
    """name -> (model, jm, out dir, inputs, runner result); one subprocess runs every module."""
    root = tmp_path_factory.mktemp("emitted_dispatch")
    made, jobs = {}, {}
    for name, n, _ in CASES:
        if name not in DISPATCH_MODELS or name in PADDED_MODELS:
            # they stage by default (a bounded form, one padded program, a tensor argmax, an unread
            # list dropped): the dispatch host is asked for
            model, args = importlib.import_module(f"examples.dynn.{name}").example()
            jm = dycl_jax.to_jax(model, args, host="dispatch")
        else:
            model, jm = converted.default(name)
        assert jm.host == "dispatch", name
        cases = _cases(importlib.import_module(f"examples.dynn.{name}"), n)
        for case in cases:  # the emitted module holds the regions and signatures the host has run
            jm(*case)
        jm.emit(str(root / name))
        made[name] = (model, jm, root / name, cases)
        jobs[name] = (str(root / name), [tuple(a.numpy() for a in c) for c in cases], "only")
    results = run_emitted(root, jobs)
    return {name: made[name] + (results[name],) for name in made}


def _captured_again(*args, **kwargs):
    raise AssertionError("emitting captured a region signature the host had captured already")


@pytest.mark.parametrize("name", [name for name, _, _ in CASES])
def test_emitted_dispatch_module_matches_torch_and_jm(name: str, emitted: dict) -> None:
    model, jm, out, cases, (status, outs) = emitted[name]
    assert status == "ok", f"{name}: the emitted module failed without torch:\n{outs}"
    text = (out / "model.py").read_text()
    with pytest.MonkeyPatch.context() as patch:  # written from the host's own captures: none made again
        if name not in CAPTURED_AGAIN:
            patch.setattr(hosted, "capture_call", _captured_again)
        assert text == jm.to_source()
    imports = {ln.split()[1].split(".")[0] for ln in text.splitlines() if ln.startswith(("import ", "from "))}
    assert imports <= {"os", "jax", "numpy", "safetensors", "flax"}, imports
    # jitted regions; control flow located in the user's file (`# file.py:line` at a host decision,
    # `# if@file.py:line` inside a staged island: numpy_fallback and skip_logging run as one island)
    assert "@nnx.jit" in text and re.search(rf"# (\w[\w ]*@)?{name}\.py:\d+", text), name
    mod = importlib.import_module(f"examples.dynn.{name}")
    paths = set()
    for k, (case, got) in enumerate(zip(cases, outs)):
        compare(name, k, model, jm, case, got)
        paths.add(mod.path_of(model, case))
    assert len(paths) >= MIN_PATHS[name], f"{name}: the inputs exercise only {paths}"


def test_emit_refuses_a_part_the_host_ran_only_in_torch_for_a_shared_list() -> None:
    # `history = scores` (one list) goes into every later part that appends to it: the host runs
    # those in torch, so no graph exists to write (a KeyError of ours while writing before)
    torch.manual_seed(0)
    model = NumpyWhile().eval()
    x = torch.randn(2, 6, generator=torch.Generator().manual_seed(1)) * 3
    jm = dycl_jax.to_jax(model, (x,), host="auto")
    assert jm.host == "dispatch"
    assert_same(model(x), jm(x), "live host")
    with pytest.raises(dycl_jax.DyclError, match="under several names") as err:
        jm.to_source()
    assert err.value.location is not None and err.value.location.line > 0


class SavedAlias(torch.nn.Module):
    """A dispatch part that appends to `outs` (only in place) and names it `saved` too; the
    other path binds the name on the host."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.fc2 = torch.nn.Linear(4, 4)

    def forward(self, x):
        outs = [x]
        h = torch.relu(self.fc(x))
        if x.sum() > 0:
            g = self.fc2(h)
            outs.append(g)
            saved = outs
        else:
            saved = outs
        return outs, saved, len(saved)


def test_emitted_dispatch_part_keeps_one_list_under_two_names(tmp_path) -> None:
    """The part's program returns new lists: the emitted host writes them into the caller's list
    and binds `saved` to it again, so `saved is outs` as in torch (it gave two lists before)."""
    torch.manual_seed(0)
    model = SavedAlias().eval()
    xs = [torch.ones(2, 4) * 3, -torch.ones(2, 4) * 3]
    jm = dycl_jax.to_jax(model, (xs[0],), host="dispatch")
    for x in xs:
        jm(x)
    spec = importlib.util.spec_from_file_location("emitted_saved_alias", jm.emit(str(tmp_path / "m")))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    emitted = module.load()
    assert "outs[:]" in (tmp_path / "m" / "model.py").read_text()
    for k, x in enumerate(xs):
        with torch.no_grad():
            want = model(x)
        got = emitted(x.numpy())
        assert_same(want, got, f"input {k}")
        assert_same(want, jm(x), f"input {k} jm")
        assert got[0] is got[1] and want[0] is want[1], k  # one list, as torch's


class ListMax(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, lengths):
        n = max((lengths - 1).tolist())  # Python on the list in the same statement: no numpy function returns it
        return self.fc(x)[:, :n], n


def test_emit_refuses_python_on_a_tolist_inside_its_statement_located() -> None:
    # (`.tolist()` as a statement's value has a numpy form: captioning_teacher above)
    torch.manual_seed(0)
    jm = dycl_jax.to_jax(ListMax().eval(), (torch.randn(2, 4), torch.tensor([3, 2])), host="dispatch")
    assert jm.host == "dispatch"
    jm(torch.randn(2, 4), torch.tensor([4, 1]))
    with pytest.raises(dycl_jax.DyclError, match="Python values of a `.tolist[(][)]`") as err:
        jm.to_source()
    assert err.value.location.file.endswith("test_emit_dispatch.py") and err.value.location.line > 0


class Appender(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x, outs):
        h = torch.relu(self.fc(x)) + 1
        if h.sum() > 0:
            outs.append(h)
        return h


class CallsAppender(torch.nn.Module):
    """A host decision around a submodule call that appends to the caller's list: the host runs
    the rest of the method as a staged island (`_dycl_tail_`)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Appender()

    def forward(self, x):
        outs = []
        if x.sum() > 0:
            h = self.block(x, outs)
        else:
            h = self.block(-x, outs)
        return outs, len(outs)


def test_emitted_submodule_append_in_a_branch_reaches_the_callers_list(tmp_path) -> None:
    # the submodule appends on one side of its `if` only: it is a dispatch host of its own, and
    # the caller's list gets its append in jm and in the emitted module (jm lost it before)
    torch.manual_seed(0)
    model = CallsAppender().eval()
    jm = dycl_jax.to_jax(model, (torch.ones(2, 4),), host="dispatch")
    xs = [torch.ones(2, 4), -torch.ones(2, 4) * 3, torch.randn(2, 4)]
    for x in xs:
        assert_same(model(x), jm(x), "jm")
    jm.emit(str(tmp_path))
    spec = importlib.util.spec_from_file_location("emitted_calls_appender", tmp_path / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    emitted = module.load()
    for x in xs:
        want, got = model(x), emitted(x.numpy())
        assert len(got[0]) == len(want[0]) == int(got[1]) == 1
        torch.testing.assert_close(torch.as_tensor(np.asarray(got[0][0])), want[0][0], rtol=1e-5, atol=1e-5)