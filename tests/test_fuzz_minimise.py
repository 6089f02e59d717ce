"""The fuzz minimiser (scripts/fuzz_minimise.py) shrinks a failing program to the statements the
failure needs, keeps it failing and valid, and leaves `__init__` (the seeded weights) alone."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import fuzz  # noqa: E402
from fuzz_minimise import minimise  # noqa: E402

SEED = 35  # its forward hashes `cnt` (int64 `%`)
BUG_SEED = 159  # converts and matches torch; a Linear on one path feeds the output


def _runs_in_torch(source: str, folder: Path) -> bool:
    """The program is valid: torch runs it on the seed's inputs."""
    try:
        model = fuzz.build(SEED, folder, source)
        with torch.no_grad():
            for args in fuzz.inputs(SEED):
                model(*args)
    except Exception:  # noqa: BLE001 - a removal left a name unassigned, etc.
        return False
    return True


def _forward(tree: ast.Module) -> ast.FunctionDef:
    """`Fuzzed.forward` of a parsed program."""
    return next(f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "Fuzzed"
                for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "forward")


def _inits(tree: ast.Module) -> list[str]:
    return [ast.unparse(f) for c in tree.body if isinstance(c, ast.ClassDef)
            for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"]


def test_shrinks_to_what_the_failure_needs(tmp_path) -> None:
    source = fuzz.program(SEED, extended=True)
    # a stand-in oracle: "fails" while the program is valid and still computes `cnt` with an
    # int64 hash, so the statements the hash needs must stay and every other one can go
    def fails(src: str) -> bool:
        return "% " in src and _runs_in_torch(src, tmp_path)

    assert fails(source), "the seed's program has no hash statement: pick another seed"
    small = minimise(source, fails)
    assert small.complete and fails(small.source)
    before, after = small.statements
    assert after < before and after <= 8, (before, after, small.source)
    # nothing left can go: removing any one remaining forward statement loses the failure
    tree = ast.parse(small.source)
    for i in range(len(_forward(tree).body)):
        shorter = ast.parse(small.source)
        body = _forward(shorter).body
        del body[i]
        body[:] = body or [ast.Pass()]
        assert not fails(ast.unparse(shorter)), f"statement {i} of the minimised forward is not needed"
    # the constructors (and so the weights the seed makes) are unchanged
    assert _inits(ast.parse(source)) == _inits(tree)


def test_a_real_oracle_keeps_the_bug_and_its_kind(tmp_path, monkeypatch) -> None:
    """A wrong lowering put in on purpose (Linear's addmm scaled by 0.9): the minimised program
    still differs from torch, and is much smaller."""
    import dycl_jax.lower.ops  # noqa: F401  (registers every lowering)
    from dycl_jax.lower import registry

    table = registry._TABLE
    addmm = torch.ops.aten.addmm.default
    right = table[addmm]
    monkeypatch.setitem(table, addmm, lambda *args, **kwargs: 0.9 * right(*args, **kwargs))
    first, small = fuzz.minimise_seed(BUG_SEED, tmp_path, extended=True, max_checks=250)  # ~50 checks, ~13 s
    assert first.kind == "bug" and fuzz.bug_kind(first) == "mismatch", first
    # the candidates ran in a folder of their own: the seed's file still holds the seed's program
    assert (tmp_path / f"fuzz_{BUG_SEED}.py").read_text() == fuzz.program(BUG_SEED, True)
    assert small is not None and fuzz.check(BUG_SEED, tmp_path, source=small.source, extended=True).kind == "bug"
    assert "self.l0(" in small.source
    # 30 statements -> the 9 the return's values and the Linear need: nothing of the branches
    assert small.complete and small.statements[1] <= 12, (small.statements, small.source)


def test_a_candidate_python_refuses_is_never_kept() -> None:
    """Flattening the loop around a `break` leaves a program Python does not compile: such a
    candidate is skipped, even by an oracle that would call it failing (here: any text with a break)."""
    source = ("class Fuzzed:\n"
              "    def forward(self, h):\n"
              "        if h > 0:\n"
              "            for i in range(2):\n"
              "                if h > 1:\n"
              "                    break\n"
              "        return h\n")
    small = minimise(source, lambda text: "break" in text, max_checks=100)
    compile(small.source, "<minimised>", "exec")  # a SyntaxError here: the invalid candidate was kept
    assert "break" in small.source and "for i in range(2)" in small.source, small.source


def test_a_candidate_that_never_ends_is_stopped(tmp_path) -> None:
    """A cut can leave a loop without the statement that ended it: the candidate's check stops at
    its time bound (the minimiser then counts it as not failing) instead of running forever."""
    import time

    import pytest

    tree = ast.parse(fuzz.program(SEED, extended=True))
    _forward(tree).body.insert(0, ast.parse("while True:\n    torch.zeros(1)").body[0])
    start = time.monotonic()
    with pytest.raises(fuzz._OutOfTime), fuzz._time_bound(1.0):
        fuzz.check(SEED, tmp_path, source=ast.unparse(tree), extended=True)
    assert time.monotonic() - start < 30
