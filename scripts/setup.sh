#!/usr/bin/env bash
# Fresh-machine setup: a .venv with the CPU build of torch 2.13 (installed first, so no
# multi-GB CUDA build is pulled), then dycl-jax with its test extras.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[test]'
