"""The `dycl-jax` command line, run as a subprocess and through main(argv)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dycl_jax.cli import main

ROOT = Path(__file__).resolve().parents[1]

_GOOD = '''
import torch

class TwoMatMuls(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(4, 6))
        self.b = torch.nn.Parameter(torch.randn(6, 2))

    def forward(self, x):
        return torch.mm(torch.mm(x, self.a), self.b)

def example():
    torch.manual_seed(0)
    return TwoMatMuls(), (torch.randn(3, 4),)

def inputs(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(1 + i % 4, 4, generator=g),) for i in range(n)]
'''

# A custom operator has no lowering and never will: a stable way to meet UnsupportedOpError.
_UNSUPPORTED = '''
import torch

@torch.library.custom_op("dycl_cli_test::{name}", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2

@twice.register_fake
def _(x):
    return torch.empty_like(x)

class Twice(torch.nn.Module):
    def forward(self, x):
        return twice(x)  # the located line

def example():
    return Twice(), (torch.randn(2, 3),)
'''


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _run(*args: str) -> subprocess.CompletedProcess:
    # wide columns so rich never wraps a path inside the error panel
    env = {**os.environ, "COLUMNS": "250"}
    return subprocess.run(
        [sys.executable, "-m", "dycl_jax.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_convert_subprocess_writes_report_and_json(tmp_path):
    src = _write(tmp_path, "good.py", _GOOD)
    out_json = tmp_path / "report.json"
    proc = _run("convert", str(src), "--check", "5", "--json", str(out_json))
    assert proc.returncode == 0, proc.stderr
    assert "TwoMatMuls.forward" in proc.stdout
    assert "sub-networks" in proc.stdout and "host control flow" in proc.stdout
    data = json.loads(out_json.read_text())
    assert data["model"] == "TwoMatMuls"
    assert data["parity"]["cases"] == 6  # the example args plus inputs(5)
    assert data["parity"]["float_outputs"] == 1
    assert data["parity"]["max_abs_diff"] < 1e-4
    assert data["timings"]["first_call_s"] > 0


def test_convert_via_main(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    src = _write(tmp_path, "good_main.py", _GOOD.replace("def example", "def build"))
    assert main(["convert", f"{src}:build", "--check", "0"]) == 0
    out = capsys.readouterr().out
    assert "TwoMatMuls.forward" in out and "parity vs torch" in out
    assert re.search(r"input cases compared\s*│\s*1\b", out)


def test_bad_path_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    missing = tmp_path / "missing.py"
    assert main(["convert", str(missing)]) == 2
    err = capsys.readouterr().err
    assert "missing.py: no such Python file" in err


def test_file_without_the_function_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    src = _write(tmp_path, "nofn.py", "x = 1\n")
    assert main(["convert", str(src)]) == 2
    assert re.search(r"nofn\.py defines no function example\(\)", capsys.readouterr().err)


def test_file_that_fails_to_import_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    src = _write(tmp_path, "broken.py", "import not_a_module_dycl\n")
    assert main(["convert", str(src)]) == 2
    assert re.search(r"importing .*broken\.py failed: ModuleNotFoundError", capsys.readouterr().err)


def test_dycl_error_exits_2_with_location(tmp_path):
    src = _write(tmp_path, "unsupported.py", _UNSUPPORTED.format(name="sub"))
    proc = _run("convert", str(src))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "UnsupportedOpError" in proc.stderr
    assert "no JAX lowering for ATen operator dycl_cli_test.sub.default" in proc.stderr
    line = 1 + textwrap.dedent(_UNSUPPORTED).splitlines().index("        return twice(x)  # the located line")
    assert f"unsupported.py:{line}" in proc.stderr
    assert "return twice(x)" in proc.stderr


def test_ops_counts_every_registered_lowering(capsys):
    import dycl_jax.lower.ops  # noqa: F401
    from dycl_jax.lower.registry import registered

    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    assert f"{len(registered())} registered lowerings" in out
    assert re.search(r"linalg\s*│\s*\d+", out)


@pytest.mark.parametrize("argv", [["convert"], ["frobnicate"], ["convert", "x.py", "--host", "fast"]])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
