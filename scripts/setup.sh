#!/usr/bin/env bash
# Set up hetspec in ./.venv: the CPU build of torch unless an NVIDIA GPU is present
# (a plain "torch" requirement would pull a multi-GB CUDA build onto a CPU machine),
# then hetspec itself, enough for the embedded default pair (hetspec's own kernels).
#   scripts/setup.sh          hetspec alone: no llama.cpp to compile (the README's first command)
#   scripts/setup.sh --dev    with the extras "test", "bench", "ray" and "llama" (llama-cpp-python,
#                             compiled here: minutes): what the tests and CI need
# Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    "") extras="" ;;
    --dev) extras="[test,bench,ray,llama]" ;;
    *) echo "usage: scripts/setup.sh [--dev]" >&2; exit 2 ;;
esac
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    torch="torch==2.13.0"
else
    torch="torch==2.13.0+cpu"
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "$torch"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".$extras"
