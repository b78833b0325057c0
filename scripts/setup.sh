#!/usr/bin/env bash
# Set up hetspec in ./.venv: the CPU build of torch unless an NVIDIA GPU is present
# (a plain "torch" requirement would pull a multi-GB CUDA build onto a CPU machine),
# then hetspec with its test, benchmark and Ray Serve extras. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    torch="torch==2.13.0"
else
    torch="torch==2.13.0+cpu"
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "$torch"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,bench,ray]"
