"""A bounded differential-fuzzing campaign (scripts/fuzz.py): random dynamic modules converted
with host="auto" match the original torch module on every input, or are refused with a
DyclError located in the generated file; never a silent difference or an internal crash."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import fuzz  # noqa: E402

SEEDS = range(0, 24)  # about a minute on one core; `scripts/fuzz.py --minutes N` runs long campaigns


@pytest.mark.parametrize("seed", SEEDS)
def test_fuzzed_program_matches_torch_or_is_refused(seed, tmp_path):
    out = fuzz.check(seed, tmp_path)
    assert out.kind in ("match", "refused"), f"seed {seed}: {out.kind}: {out.detail}\n{fuzz.program(seed)}"


def test_the_campaign_covers_both_hosts_and_many_paths(tmp_path):
    """The generator is not degenerate: programs take several paths and need both hosts."""
    outs = [fuzz.check(seed, tmp_path) for seed in range(100, 112)]
    assert {o.host for o in outs if o.kind == "match"} == {"staged", "dispatch"}
    assert sum(len(o.paths) > 1 for o in outs) >= 6, [len(o.paths) for o in outs]


def test_the_oracle_sees_a_wrong_answer(tmp_path, monkeypatch):
    """A converted program that differs from torch is reported as a bug, not a match."""
    import dycl_jax

    real = dycl_jax.to_jax

    def skewed(model, args, **kw):
        jm = real(model, args, **kw)

        class Off:
            host = jm.host

            def __call__(self, *a):
                out = jm(*a)
                return (out[0] + 1e-2, *out[1:])
        return Off()

    monkeypatch.setattr(dycl_jax, "to_jax", skewed)
    out = fuzz.check(5, tmp_path)
    assert out.kind == "bug" and "max |diff|" in out.detail


REGRESSIONS = sorted((Path(__file__).parent / "fuzz_regressions").glob("seed_*.py"))


@pytest.mark.parametrize("path", REGRESSIONS, ids=[p.stem for p in REGRESSIONS])
def test_saved_fuzz_findings_stay_fixed(path, tmp_path):
    seed = int(path.stem.split("_")[1])
    out = fuzz.check(seed, tmp_path, source=path.read_text())
    assert out.kind == "match", f"{path.name}: {out.kind}: {out.detail}"
