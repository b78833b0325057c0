#!/usr/bin/env bash
# Build llama.cpp's own C++ binaries for hetspec-bench's llama.cpp peer rows
# (benchmarks/llama_bin.py): llama-bench, llama-completion (non-interactive
# generation; this llama.cpp's llama-cli is the interactive chat) and
# llama-speculative-simple, from the llama.cpp sources that the INSTALLED
# llama-cpp-python vendors (its source distribution's vendor/llama.cpp), so the
# C++ rows run the same llama.cpp as the Python peer. Release, -DGGML_NATIVE=ON,
# only those targets, into ${HETSPEC_CACHE:-~/.cache/hetspec}/llama.cpp-VERSION/bin.
#
# Cached: when the binaries are there it builds nothing. Safe to run again (and
# at once from two shells: the second waits for the first). The last line of
# stdout is the folder of the binaries; everything else goes to stderr.
#
#   PYTHON=...            the Python whose llama-cpp-python to match (default .venv/bin/python)
#   LLAMA_CPP_SDIST=FILE  a llama_cpp_python-VERSION.tar.gz already at hand (no download)
#   LLAMA_CPP_VERSION=V   its version, where no llama-cpp-python is installed (a GPU machine:
#                         scripts/gpu_pack.sh packs the sources)
#   HETSPEC_LLAMA_BIN=DIR where the benchmark looks instead (your own build); not used here
#
# About 16 CPU-minutes (25 minutes on a busy 2-core AMD EPYC), plus a 77 MB download.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
version=${LLAMA_CPP_VERSION:-}
[ -n "$version" ] || version=$("$python" -c "import llama_cpp; print(llama_cpp.__version__)" 2>/dev/null) \
    || { echo "no llama-cpp-python in $python: install it first (its version picks the llama.cpp to build)" >&2; exit 1; }
root=${HETSPEC_CACHE:-}
if [ -z "$root" ] || [ "${root,,}" = off ]; then     # "off" keeps no model copies; binaries need a home
    root=${XDG_CACHE_HOME:-$HOME/.cache}/hetspec
fi
dest="$root/llama.cpp-$version"
bin="$dest/bin"
targets=(llama-bench llama-completion llama-speculative-simple)

built() {
    local t
    for t in "${targets[@]}"; do [ -x "$bin/$t" ] || return 1; done
}

if built; then
    echo "llama.cpp $version binaries already built" >&2
    echo "$bin"
    exit 0
fi

mkdir -p "$dest"
exec 9>"$dest/.lock"
flock 9                       # another run builds: wait for it, then find its binaries
if built; then
    echo "$bin"
    exit 0
fi

work=$(mktemp -d "$dest/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
started=$SECONDS
sdist=${LLAMA_CPP_SDIST:-}
if [ -z "$sdist" ]; then
    echo "downloading the llama-cpp-python $version source distribution ..." >&2
    "$python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
        "llama-cpp-python==$version" -d "$work/sdist" >&2
    sdist=$(ls "$work"/sdist/llama_cpp_python-*.tar.gz)
fi
echo "unpacking $(basename "$sdist") ..." >&2
tar -xzf "$sdist" -C "$work" --wildcards '*/vendor/llama.cpp/*'
src=$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)
[ -f "$src/CMakeLists.txt" ] || { echo "no vendor/llama.cpp in $sdist" >&2; exit 1; }

echo "configuring llama.cpp (Release, GGML_NATIVE=ON) ..." >&2
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF >"$work/configure.log" 2>&1 \
    || { tail -30 "$work/configure.log" >&2; exit 1; }
echo "building ${targets[*]} with $(nproc) jobs (minutes) ..." >&2
cmake --build "$work/build" --config Release -j"$(nproc)" --target "${targets[@]}" >"$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log" >&2; exit 1; }

mkdir -p "$work/bin"
for t in "${targets[@]}"; do cp "$work/build/bin/$t" "$work/bin/"; done
{
    echo "llama-cpp-python $version"
    echo "llama.cpp $("$work/build/bin/llama-bench" --version 2>&1 | head -1)"
    echo "built $(date -u +%FT%TZ) on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs) in $((SECONDS - started)) s"
    echo "cmake -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF"
} >"$work/bin/BUILD_INFO"
rm -rf "$bin"
mv "$work/bin" "$bin"
echo "built llama.cpp $version in $((SECONDS - started)) s" >&2
echo "$bin"
