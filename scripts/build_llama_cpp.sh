#!/usr/bin/env bash
# Build llama.cpp's own C++ binaries for hetspec-bench's llama.cpp peer rows
# (benchmarks/bench/llama_bin.py): llama-bench, llama-completion (non-interactive
# generation; this llama.cpp's llama-cli is the interactive chat) and
# llama-speculative-simple, from the llama.cpp sources that the INSTALLED
# llama-cpp-python vendors, so the C++ rows run the same llama.cpp as hetspec's
# llama.cpp backends. Into ${HETSPEC_CACHE:-~/.cache/hetspec}/llama.cpp-VERSION/bin.
#
#   scripts/build_llama_cpp.sh           the binaries. Where `scripts/setup.sh --dev` kept
#                                        llama-cpp-python's CMake build tree, they are built in
#                                        it, from its objects and flags (a minute or two);
#                                        else llama.cpp is built whole: Release,
#                                        -DGGML_NATIVE=ON, static (about 16 CPU-minutes)
#   scripts/build_llama_cpp.sh --python  (setup.sh --dev) install llama-cpp-python from its
#                                        sources, keeping them and the build tree for the above
#   scripts/build_llama_cpp.sh --server  the same binaries and llama-server (the concurrency
#                                        benchmark's peer: benchmarks/concurrency.py), opt-in:
#                                        setup.sh and CI never build it (its HTTP stack and the
#                                        multimodal library it links cost minutes on 2 cores).
#                                        Its web UI is left out (no download, an empty page)
#   scripts/build_llama_cpp.sh [--server] --isa avx2
#                                        the same, built for AVX2, FMA, F16C and BMI2 alone
#                                        (GGML_NATIVE=OFF, every AVX-512 and VNNI flag off), into
#                                        bin-avx2: the peer of hetspec's kernels built with
#                                        HETSPEC_ISA=avx2 on a machine that has more (whole,
#                                        static: about 16 CPU-minutes). `--isa native`: the default
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
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
root=${HETSPEC_CACHE:-}
if [ -z "$root" ] || [ "${root,,}" = off ]; then     # "off" keeps no model copies; binaries need a home
    root=${XDG_CACHE_HOME:-$HOME/.cache}/hetspec
fi
targets=(llama-bench llama-completion llama-speculative-simple)
server=OFF
mode=
isa=${HETSPEC_ISA:-native}
usage() { echo "usage: scripts/build_llama_cpp.sh [--python | --server] [--isa native|avx2]" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --server) server=ON; targets+=(llama-server) ;;
        --python) mode=python ;;
        --isa) [ $# -ge 2 ] || usage; isa=$2; shift ;;
        *) usage ;;
    esac
    shift
done
case "$isa" in
    native) isa_flags=(-DGGML_NATIVE=ON); bin_name=bin ;;
    avx2) isa_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                     -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF
                     -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
          bin_name=bin-avx2 ;;
    *) echo "--isa $isa: not one of native, avx2" >&2; exit 2 ;;
esac
installed() { "$python" -c "import llama_cpp; print(llama_cpp.__version__)" 2>/dev/null; }

# download the source distribution that a pip requirement names into $1; prints its path
download_sdist() {
    echo "downloading the $2 source distribution ..." >&2
    "$python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: "$2" -d "$1" >&2
    ls "$1"/llama_cpp_python-*.tar.gz
}

# --python: install llama-cpp-python from sources kept in the cache, with its build tree
if [ "$mode" = python ]; then
    requirement=${LLAMA_CPP_REQUIREMENT:-llama-cpp-python}
    version=$(installed) || true
    if [ -n "$version" ] && [ -f "$root/llama.cpp-$version/python-build/CMakeCache.txt" ]; then
        echo "llama-cpp-python $version already built here, its build tree kept" >&2
        exit 0
    fi
    mkdir -p "$root"
    fetched=$(mktemp -d "$root/sdist.XXXXXX")
    trap 'rm -rf "$fetched"' EXIT
    sdist=${LLAMA_CPP_SDIST:-$(download_sdist "$fetched" "$requirement")}
    version=$(basename "$sdist" .tar.gz)
    version=${version#llama_cpp_python-}
    dest="$root/llama.cpp-$version"
    mkdir -p "$dest"
    exec 9>"$dest/.lock"
    flock 9
    rm -rf "$dest/python-src" "$dest/python-build"
    mkdir "$dest/python-src"
    tar -xzf "$sdist" -C "$dest/python-src" --strip-components 1 \
        --exclude '*/vendor/llama.cpp/models/*' --exclude '*/vendor/llama.cpp/docs/*'
    echo "building llama-cpp-python $version (minutes) ..." >&2
    SKBUILD_BUILD_DIR="$dest/python-build" CMAKE_ARGS="${CMAKE_ARGS:-} -DLLAVA_BUILD=OFF" \
        "$python" -m pip install -q --disable-pip-version-check "$dest/python-src" >&2
    exit 0
fi

version=${LLAMA_CPP_VERSION:-}
[ -n "$version" ] || version=$(installed) \
    || { echo "no llama-cpp-python in $python: install it first (its version picks the llama.cpp to build)" >&2; exit 1; }
dest="$root/llama.cpp-$version"
bin="$dest/$bin_name"

built() {
    local t
    for t in "${targets[@]}"; do [ -x "$bin/$t" ] || return 1; done
}

# the tools, in the build tree that --python kept: its objects, flags and shared libraries
build_in_kept_tree() {
    local tree="$dest/python-build"
    echo "building ${targets[*]} in llama-cpp-python's build tree ..." >&2
    cmake -S "$dest/python-src" -B "$tree" -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON \
        -DLLAMA_BUILD_SERVER=$server -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        >"$dest/configure.log" 2>&1 || { tail -30 "$dest/configure.log" >&2; exit 1; }
    cmake --build "$tree" -j"$(nproc)" --target "${targets[@]}" >"$dest/build.log" 2>&1 \
        || { tail -40 "$dest/build.log" >&2; exit 1; }
    info "$tree/bin" "llama-cpp-python's own: $(grep -E '^(CMAKE_BUILD_TYPE|GGML_NATIVE|BUILD_SHARED_LIBS):' "$tree/CMakeCache.txt" | xargs)"
    ln -sfn python-build/bin "$bin"       # the binaries find their libraries there
}

# llama.cpp whole, static, from the vendored sources alone
build_whole() {
    local sdist src          # work: global, for the EXIT trap after this returns
    work=$(mktemp -d "$dest/build.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    if [ -f "$dest/python-src/vendor/llama.cpp/CMakeLists.txt" ]; then     # the sources --python kept
        src="$dest/python-src/vendor/llama.cpp"
    else
        sdist=${LLAMA_CPP_SDIST:-$(download_sdist "$work/sdist" "llama-cpp-python==$version")}
        echo "unpacking $(basename "$sdist") ..." >&2
        tar -xzf "$sdist" -C "$work" --wildcards '*/vendor/llama.cpp/*'
        src=$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)
    fi
    [ -f "$src/CMakeLists.txt" ] || { echo "no vendor/llama.cpp in $src" >&2; exit 1; }
    echo "configuring llama.cpp (Release, ${isa_flags[*]}) ..." >&2
    cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release "${isa_flags[@]}" -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=$server -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF >"$work/configure.log" 2>&1 \
        || { tail -30 "$work/configure.log" >&2; exit 1; }
    echo "building ${targets[*]} with $(nproc) jobs (minutes) ..." >&2
    cmake --build "$work/build" --config Release -j"$(nproc)" --target "${targets[@]}" >"$work/build.log" 2>&1 \
        || { tail -40 "$work/build.log" >&2; exit 1; }
    mkdir -p "$work/bin"
    for t in "${targets[@]}"; do cp "$work/build/bin/$t" "$work/bin/"; done
    info "$work/bin" "cmake -DCMAKE_BUILD_TYPE=Release ${isa_flags[*]} -DBUILD_SHARED_LIBS=OFF"
    rm -rf "$bin"
    mv "$work/bin" "$bin"
}

# BUILD_INFO beside the binaries: which llama.cpp, where, how
info() {
    {
        echo "llama-cpp-python $version"
        echo "llama.cpp $("$1/llama-bench" --version 2>&1 | head -1)"
        echo "built $(date -u +%FT%TZ) on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs) in $((SECONDS - started)) s"
        echo "$2"
        echo "tools: ${targets[*]}"
    } >"$1/BUILD_INFO"
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
started=$SECONDS
if [ "$isa" = native ] && [ -f "$dest/python-build/CMakeCache.txt" ] && [ -d "$dest/python-src" ]; then
    build_in_kept_tree
else
    build_whole
fi
echo "built llama.cpp $version's ${targets[*]} in $((SECONDS - started)) s" >&2
echo "$bin"
