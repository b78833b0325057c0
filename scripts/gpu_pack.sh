#!/usr/bin/env bash
# Packs, into .gpu/ (ignored by git), what scripts/gpu_check.sh needs on a lent GPU machine
# that fetches nothing and takes at most 64 MiB of files: run it here, then name .gpu in
# the device call's carry.
#   .gpu/wheels/      the Python packages hetspec needs that the machine's image lacks (pyzmq,
#                     gguf: 1 MB; every step of gpu_check.sh needs them)
#   .gpu/llama.cpp.tar.gz   llama.cpp's sources from the installed llama-cpp-python's source
#                     distribution, less what a CPU build of its tools never reads (the
#                     other backends, models, docs), for scripts/build_llama_cpp.sh there
#   .gpu/VERSION      that llama-cpp-python's version
#   .gpu/headers/     the headers of the GGUF files to time there (hetspec.benchmarks.shaped_gguf),
#                     each expanded there into a file of the same shape with random weights
# (llama.cpp's sources and the headers serve gpu_check.sh's cores step only: 7 MB of the 8.3.)
#
#   scripts/gpu_pack.sh [GGUF ...]    (default: the shipped SmolLM2 and Gemma 3 files)
#   PYTHON=...  LLAMA_CPP_SDIST=FILE (the source distribution, when already at hand)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
pack=.gpu
rm -rf "$pack" && mkdir -p "$pack/wheels" "$pack/headers"

echo "wheels (CPython 3.12, manylinux) ..." >&2
"$python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$pack/wheels" pyzmq gguf >&2

version=$("$python" -c "import llama_cpp; print(llama_cpp.__version__)")
echo "$version" >"$pack/VERSION"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sdist=${LLAMA_CPP_SDIST:-}
if [ -z "$sdist" ]; then
    "$python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
        "llama-cpp-python==$version" -d "$work" >&2
    sdist=$(ls "$work"/llama_cpp_python-*.tar.gz)
fi
echo "llama.cpp sources from $(basename "$sdist") ..." >&2
tar -xzf "$sdist" -C "$work" --wildcards '*/vendor/llama.cpp/*'
top=$(basename "$(ls -d "$work"/llama_cpp_python-*/)")      # the folder, not the sdist beside it
src="$work/$top/vendor/llama.cpp"
rm -rf "$src"/{models,docs,media,gguf-py,benches,tests,conversion,.github} "$src"/tools/{ui,server}
for backend in "$src"/ggml/src/ggml-*/; do
    case $(basename "$backend") in ggml-cpu) ;; *) rm -rf "$backend" ;; esac
done
tar -czf "$pack/llama.cpp.tar.gz" -C "$work" "$top/vendor/llama.cpp"

[ $# -gt 0 ] || set -- builtin:smollm2 builtin:gemma3-270m
for model in "$@"; do
    file=$("$python" -c "import sys; from hetspec.models import resolve_model; print(resolve_model(sys.argv[1]).file)" "$model")
    "$python" -m hetspec.benchmarks.shaped_gguf header "$file" "$pack/headers/$(basename "$file").gz"
done
du -sh "$pack" >&2
echo "$pack"
