#!/usr/bin/env bash
# GPU benchmark in one command (under 5 minutes on one GPU): torch eager (CUDA) vs dycl_jax (XLA GPU)
# at batch 1 and 32, with conversion and compile times, float32 precision pinned on both sides.
# Needs a CUDA torch and jax[cuda12] in .venv (README, "GPU"); on a machine without a GPU: --device cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
exec timeout 290 "$PY" scripts/device_bench.py --budget 200 "$@"
