"""The `dycl-jax` command line: targets, input specs, exit statuses, golden text at 80 columns."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from dycl_jax.cli import main
from dycl_jax.command import progress

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden"

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

def build():
    torch.manual_seed(0)
    return TwoMatMuls()

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
'''


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "120", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "dycl_jax.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def columns80(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")


def _scrub(text: str) -> str:
    """Timings and the float error vary from run to run (and the error's digits set the parity
    table's width): the golden text holds a placeholder for each timing and for that table."""
    # every timing cell (wall and CPU seconds)
    text = re.sub(r"(?<=│)( +\d+\.\d{3})(?= │)", lambda m: f"{'t.ttt':>{len(m[1])}}", text)
    return re.sub(r"^parity vs torch.*?┘\n", "(parity table)\n", text, flags=re.M | re.S)


def test_convert_golden_at_80_columns(columns80, capsys, monkeypatch):
    seen: list[str] = []
    original = progress.Stages.__call__
    monkeypatch.setattr(progress.Stages, "__call__", lambda self, stage: (seen.append(stage), original(self, stage)))
    assert main(["convert", "tests/cli_models.py:gated", "--input-shape", "2x8", "--check", "3"]) == 0
    captured = capsys.readouterr()
    text = _scrub(captured.out)
    path = GOLDEN / "cli_convert_gated_80.txt"
    if os.environ.get("DYCL_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()
    assert "parity ok: 4 inputs match torch" in captured.err
    assert seen[:2] == ["rewrite + capture", "lower"] and seen[-2].startswith("first call")
    assert seen[-1] == "parity check against torch (4 inputs)"


def test_module_factory_class_and_example_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "cli_factories.py", _GOOD)
    # the example-file form: example() gives (model, args), inputs(n) the --check cases
    assert main(["convert", "cli_factories.py", "--check", "2", "--json", "e.json"]) == 0
    data = json.loads((tmp_path / "e.json").read_text())
    assert data["parity"]["cases"] == 3 and data["parity"]["max_abs_diff"] < 1e-4
    assert data["timings"]["first_call_s"] > 0
    assert main(["convert", "cli_factories:TwoMatMuls", "--input-shape", "3x4", "--check", "2", "--json",
                 "r.json"]) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["inputs"] == ["x: float32[B, 4]"] and data["parity"]["cases"] == 3
    torch.save((torch.randn(5, 4),), tmp_path / "ex.pt")
    capsys.readouterr()
    assert main(["convert", "cli_factories.py:build", "--example", "ex.pt", "--check", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)  # --json without a file: the record on stdout, no tables
    assert data["parity"]["cases"] == 2 and data["subnetworks"][0]["inputs"] == ["x"]


def test_example_file_importing_its_project_package_from_elsewhere(tmp_path, monkeypatch):
    # proj/dyclpkg_cli/models/m.py does `from dyclpkg_cli.helpers import ...`; run from outside proj
    monkeypatch.setattr(sys, "path", list(sys.path))
    pkg = tmp_path / "proj" / "dyclpkg_cli"
    (pkg / "models").mkdir(parents=True)
    _write(pkg, "helpers.py", _GOOD)
    model_file = _write(pkg / "models", "m.py", "from dyclpkg_cli.helpers import example, inputs\n")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["convert", str(model_file), "--check", "1"]) == 0
    assert str(tmp_path / "proj") in sys.path


def test_refused_conversion_exits_1_with_location(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # no wrapping inside the panel
    src = _write(tmp_path, "unsupported.py", _UNSUPPORTED.format(name="sub"))
    assert main(["convert", f"{src}:Twice", "--input-shape", "2x3"]) == 1
    err = capsys.readouterr().err
    assert "UnsupportedOpError" in err and "dycl_cli_test.sub.default" in err
    line = 1 + textwrap.dedent(_UNSUPPORTED).splitlines().index("        return twice(x)  # the located line")
    assert f"unsupported.py:{line}" in err and "return twice(x)" in err


def test_parity_failure_exits_2(capsys):
    assert main(["convert", "tests/cli_models.py:Noisy", "--input-shape", "2x3", "--check", "1"]) == 2
    captured = capsys.readouterr()
    assert "parity FAILED: 2 of 2 inputs differ from torch" in captured.err
    assert "MISMATCH" in captured.out


def test_a_global_kept_across_calls_is_refused_at_its_line(capsys):
    assert main(["convert", "tests/cli_models.py:Drift", "--input-shape", "2x3"]) == 1
    err = capsys.readouterr().err
    assert "`_DRIFT` (a global of cli_models.py) carries" in " ".join(err.replace("│", " ").split()), err
    line = 1 + Path("tests/cli_models.py").read_text().splitlines().index("        _DRIFT[0] += 1.0")
    assert f"cli_models.py:{line}" in err and "_DRIFT[0] += 1.0" in err


@pytest.mark.parametrize("argv, message", [
    (["convert", "no_such_module_dycl:build", "--input-shape", "2"], "no module named 'no_such_module_dycl'"),
    (["convert", "tests/cli_models.py:nothing", "--input-shape", "2"], "defines no function nothing()"),
    (["convert", "cli_models:nothing", "--input-shape", "2"], "cli_models defines no nothing"),
    (["convert", "tests/missing.py"], "tests/missing.py: no such Python file"),
    (["convert", "tests/cli_models.py:Drift", "--input-shape", "2xq"], "bad shape '2xq'"),
    (["convert", "tests/cli_models.py:Drift", "--input-shape", "2", "--dtype", "float33"], "unknown dtype 'float33'"),
    (["convert", "tests/cli_models.py:Drift", "--input-shape", "2", "--input-shape", "3", "--dtype", "int32",
      "--dtype", "bool", "--dtype", "int8"], "2 --input-shape but 3 --dtype"),
    (["convert", "tests/cli_models.py:Drift", "--example", "tests/none.pt"], "tests/none.pt: no such file"),
    (["convert", "tests/cli_models.py:Drift"], "gives a model but no example inputs"),
    (["convert", "tests/cli_models.py:Block", "--input-shape", "2x8"], None),  # width has a default: builds
    (["convert", "x.py", "--host", "fast"], "invalid choice: 'fast'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_usage_errors_exit_3_in_one_line(argv, message, capsys):
    if message is None:
        assert main(argv + ["--check", "0"]) == 0
        return
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own errors
        status = exc.code
    assert status == 3
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_help_documents_exit_statuses(capsys):
    with pytest.raises(SystemExit) as info:
        main(["convert", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for status in ("0  ok", "1  conversion refused", "2  parity failure", "3  usage error"):
        assert status in out


def test_bench_subprocess():
    # a subprocess: bench pins the process to one core and one thread; also `python -m dycl_jax.cli`
    proc = _run("bench", "torch.nn:Tanh", "--input-shape", "4x8", "--runs", "3", "--warmup", "1", "--check", "1")
    assert proc.returncode == 0, proc.stderr
    assert "torch ms" in proc.stdout and "Tanh" in proc.stdout
    row = next(line for line in proc.stdout.splitlines() if "Tanh" in line)
    assert re.search(r"staged\s*│\s*\d+\.\d{3}\s*│\s*\d+\.\d{3}", row)


def test_ops_counts_every_registered_lowering(capsys):
    import dycl_jax.lower.ops  # noqa: F401
    from dycl_jax.lower.registry import registered

    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    assert f"{len(registered())} registered lowerings" in out
    assert re.search(r"linalg\s*│\s*\d+", out)


def test_convert_out_writes_artifact_source_and_report(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["convert", "tests/cli_models.py:gated", "--input-shape", "2x8", "--check", "1", "--out", str(out)]) == 0
    assert "wrote report.json, artifact/, flax/" in capsys.readouterr().err
    assert (out / "artifact" / "manifest.json").is_file() and (out / "flax" / "model.py").is_file()
    import dycl_jax
    from tests.cli_models import gated

    model = gated().eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        want = model(x)
    got = dycl_jax.load(str(out / "artifact"))(x.numpy())
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.from_numpy(np.array(g)), w, rtol=1e-4, atol=1e-5)
    assert main(["report", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "if at cli_models.py:30" in shown and "artifact:" in shown and "host staged" in shown


def test_emit_command_writes_model_py(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, "cli_factories.py", _GOOD)
    assert main(["emit", "cli_factories.py", "--out", "flax_out"]) == 0
    assert "wrote flax_out/model.py" in capsys.readouterr().out
    assert "class TwoMatMuls(nnx.Module)" in (tmp_path / "flax_out" / "model.py").read_text()


def test_report_of_a_missing_directory_exits_3(tmp_path, capsys):
    assert main(["report", str(tmp_path / "none")]) == 3
    err = capsys.readouterr().err
    assert "report.json not found" in err and "Traceback" not in err


def test_convert_out_of_a_dispatch_model_golden(columns80, tmp_path, capsys):
    """`convert --host dispatch --out DIR` writes the artifact and the emitted source of a dispatch-host
    model; `report DIR` shows its record (golden text at 80 columns, no colour)."""
    out = tmp_path / "o"
    argv = ["convert", "tests/cli_models.py:picker", "--input-shape", "2x4", "--host", "dispatch", "--check", "2"]
    assert main(argv + ["--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "wrote report.json, artifact/, flax/" in err, err
    assert main(["report", str(out)]) == 0
    text = _scrub(capsys.readouterr().out.replace(str(out), "DIR"))
    path = GOLDEN / "report_dispatch_picker_80.txt"
    if os.environ.get("DYCL_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()
    source = (out / "flax" / "model.py").read_text()
    assert "class Picker(nnx.Module)" in source and "# cli_models.py:86" in source and "import torch" not in source
