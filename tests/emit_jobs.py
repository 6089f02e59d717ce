"""Runs emitted model.py files in ONE torch-free subprocess (tests/emit_runner.py, one jax import)."""
from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).with_name("emit_runner.py")


def run_emitted(root: Path, jobs: dict) -> dict:
    """`jobs`: {name: (emitted dir, input tuples of numpy arrays, eager)} (eager "train": (inputs, key
    seed) pairs, the statistics after the calls come last); returns {name: ("ok",
    outputs) or ("error", traceback)} (see emit_runner.main)."""
    with open(root / "jobs.pkl", "wb") as f:
        pickle.dump(jobs, f)
    proc = subprocess.run([sys.executable, str(RUNNER), str(root / "jobs.pkl"), str(root / "res.pkl")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(root / "res.pkl", "rb") as f:
        return pickle.load(f)
