"""Dicts and aliased lists through a dispatch-host artifact, loaded where torch cannot be imported,
against the ORIGINAL torch model: dict values in their own key order (JAX's pytrees sort keys),
and a part the live host runs in torch because it changes one list held under two names is
listed as uncovered in the manifest and refused at call time, never answered differently."""
from __future__ import annotations

import inspect
import warnings

import numpy as np
import torch

import dycl_jax
import torch_free  # tests/: a subprocess where torch cannot be imported
from differential import assert_same  # pytest puts tests/ on sys.path
from test_list_identity import AliasAppendedOnHost, _OneLinear


class DictOnHost(_OneLinear):
    """A dict grown in an `.item()` branch on the host, read by position in a later region
    (`list(d.values())[0]`: insertion order, which sorted keys would change) and returned."""

    def taken(self, x) -> bool:
        return bool(self.fc(x).mean() > 0)

    def forward(self, x):
        h = self.fc(x)
        d = {"z": h * 2, "a": h - 1}
        if h.mean().item() > 0:
            d["b"] = h + 3
        return list(d.values())[0] + list(d.values())[-1], d


RUNNER = """
import numpy as np
import dycl_jax
for name, (path, xs) in jobs.items():
    model = dycl_jax.load(path)
    got = []
    for x in xs:
        try:
            y, d = model(x) if name == "dict" else (model(x), None)
            got.append(("ok", y if d is None else (np.asarray(y), [(k, np.asarray(v)) for k, v in d.items()])))
        except dycl_jax.DyclError as err:
            got.append((type(err).__name__, err.message))
    out[name] = got
"""


def test_dicts_keep_their_order_and_aliased_lists_are_refused_not_split(tmp_path) -> None:
    jobs, models, manifests = {}, {}, {}
    for name, cls in (("dict", DictOnHost), ("alias", AliasAppendedOnHost)):
        torch.manual_seed(0)
        model = models[name] = cls().eval()
        g = torch.Generator().manual_seed(2)
        xs = [torch.randn(1, 6, generator=g) for _ in range(4)]
        assert {model.taken(x) for x in xs} == {True, False}, "both paths must run before export"
        jm = dycl_jax.to_jax(model, (xs[0],), host="dispatch")
        for x in xs:
            jm(x)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the coverage warnings: checked in the manifest below)
            manifests[name] = jm.export(str(tmp_path / name))
        jobs[name] = (str(tmp_path / name), [x.numpy() for x in xs])
    out = torch_free.run(tmp_path, RUNNER, jobs)
    assert out["torch loaded"] == []
    for k, (x, (kind, got)) in enumerate(zip(jobs["dict"][1], out["dict"])):
        assert kind == "ok", got  # (a CallError before: the dict's tree did not match the exported one)
        with torch.no_grad():
            y, d = models["dict"](torch.from_numpy(x))
        assert_same(y, got[0], f"dict input {k}")
        assert [n for n, _ in got[1]] == list(d), k
        for (n, v) in got[1]:
            np.testing.assert_allclose(v, d[n].numpy(), rtol=1e-6, atol=1e-6, err_msg=f"dict input {k} {n}")
    # the parts taking `outs`, `also` and `saved` (one list) ran in torch on the live host: the
    # manifest says so and every call is refused, naming the names
    uncovered = manifests["alias"]["coverage"]["uncovered"]
    assert manifests["alias"]["coverage"]["complete"] is False
    lines, start = inspect.getsourcelines(AliasAppendedOnHost.forward)
    appends = {start + i for i, line in enumerate(lines) if ".append(" in line}
    assert {u["line"] for u in uncovered if "under several names" in u["what"]} == appends
    for kind, message in out["alias"]:
        assert kind == "CallError" and "under several names" in message and "`saved`" in message, message
