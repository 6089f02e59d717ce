"""Runs a script in a subprocess where `import torch` fails (its sys.modules entry is None), as in
a serving image without torch: the script reads `jobs` and fills `out`, which come back."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_HEAD = 'import sys\nsys.modules["torch"] = None\nimport pickle\njobs = pickle.load(open(sys.argv[1], "rb"))\nout = {}\n'
_TAIL = ('\nout["torch loaded"] = [m for m, v in sys.modules.items() if m.split(".")[0] == "torch" and v is not None]\n'
         'pickle.dump(out, open(sys.argv[2], "wb"))\n')


def run(root: Path, body: str, jobs: Any) -> dict:
    """`body` run on `jobs` without torch; its `out` dict, with "torch loaded" (torch modules
    imported after all: none) added."""
    with open(root / "jobs.pkl", "wb") as f:
        pickle.dump(jobs, f)
    env = {**os.environ, "PYTHONPATH": ROOT, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _HEAD + body + _TAIL, str(root / "jobs.pkl"), str(root / "out.pkl")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(root / "out.pkl", "rb") as f:
        return pickle.load(f)
