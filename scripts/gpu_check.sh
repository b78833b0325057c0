#!/usr/bin/env bash
# The GPU checks, in one call on a lent machine (15 minutes, nothing fetched there): on a
# machine with an NVIDIA GPU and hetspec set up, from anywhere.
#   scripts/gpu_check.sh [STEP ...]     steps: tests profile cores (default: tests profile)
# tests:   tests/test_gpu.py (exactness and sampling with the target on cuda, passes eager,
#          static and captured)
# profile: benchmarks/gpu_profile.py (a Llama-2-7B-shaped bfloat16 target, random weights
#          drawn on the GPU: its pass eager, static and captured, wall and kernel time; the
#          engine's rounds; generate), into $OUT/profile.json and $OUT/report.md; the JSON's
#          paced_profile is a [target] profile for the paced target
# cores:   the native target alone against llama.cpp's own loop on this machine's CPU cores
#          (benchmarks/target_alone.py at 2 threads, 8 and all of them; CORES_THREADS sets
#          them), on files shaped like the ones packed (random weights: speed only)
# Every model is random (no weights to carry). The steps share one budget, GPU_CHECK_S
# (default 220 s: with the machine's start, under 4 minutes of a 15-minute loan, room to run
# it again): tests stop at TESTS_S (default 120 s) or what is left, the profile starts no
# step past what is left less 30 s (its last step's length), and writes its JSON after each.
# The steps run in order of value: exactness (tests), then the pass curves, then the engine.
# A lent machine fetches nothing: scripts/gpu_pack.sh packs .gpu/ here (the wheels the image
# lacks, 1 MB; for cores, llama.cpp's sources and the GGUF headers, 7 MB more); carried there,
# the wheels are installed before the steps and the tree is put on PYTHONPATH as hetspec.
# GPU_CHECK_REHEARSE=1 rehearses it all on a CPU with this environment (PYTHON=.venv/bin/python):
# the profile at tiny shapes (--device cpu), the GPU tests skipped; under half a minute. CI
# rehearses it on the GPU image's transformers (tests/test_transformers_versions.py).
# Each step's log, and the reports, go to $OUT (default gpu-out). Exits 1 if a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
py=${PYTHON:-python3}
rehearse=${GPU_CHECK_REHEARSE:-0}
budget=${GPU_CHECK_S:-220}
mkdir -p "$out"
status=0

if [ -d .gpu ] && [ "$rehearse" = 0 ]; then      # a lent machine: the carried wheels, and this tree as hetspec
    site=/tmp/hetspec-site
    rm -rf "$site" && mkdir -p "$site"
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .gpu/wheels/*.whl
    cp -r hetspec "$site/hetspec" && cp -r ipc "$site/hetspec/ipc" && cp -r workers "$site/hetspec/workers" \
        && cp -r benchmarks "$site/hetspec/benchmarks"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONSAFEPATH=1   # not ./hetspec, a part of it
fi

left() { echo $((budget - SECONDS)); }

cores() {   # build llama.cpp from .gpu's sources, expand the headers, time both
    local bin shaped=/tmp/hetspec-shaped models=() h
    [ -f .gpu/llama.cpp.tar.gz ] || { echo "cores needs .gpu/ (scripts/gpu_pack.sh)"; return 1; }
    bin=$(LLAMA_CPP_SDIST=.gpu/llama.cpp.tar.gz LLAMA_CPP_VERSION=$(cat .gpu/VERSION) PYTHON="$py" \
        scripts/build_llama_cpp.sh | tail -1) || return 1
    mkdir -p "$shaped"
    for h in .gpu/headers/*.gz; do
        "$py" -m hetspec.benchmarks.shaped_gguf expand "$h" "$shaped/shaped-$(basename "$h" .gz)" || return 1
        models+=(--model "$shaped/shaped-$(basename "$h" .gz)")
    done
    lscpu | grep -E "Model name|^CPU\(s\)|Thread|Flags" | cut -c1-400
    # shellcheck disable=SC2086
    HETSPEC_LLAMA_BIN=$bin timeout "$(left)" "$py" -m hetspec.benchmarks.target_alone "${models[@]}" \
        --threads ${CORES_THREADS:-2 8 $(nproc)} --out "$out/cores"
}

step() {   # NAME COMMAND...: the command's output in $out/NAME.log, its tail here
    local name=$1 start=$SECONDS rc
    shift
    echo "== $name: $*"
    "$@" >"$out/$name.log" 2>&1
    rc=$?
    echo "== $name: exit $rc after $((SECONDS - start)) s$([ "$rc" -eq 124 ] && echo ' (stopped at its limit)')"
    grep -v '^USDT:' "$out/$name.log" | tail -n 30       # not the profiler's start and stop lines
    [ "$rc" -eq 0 ] || status=1
}

profile_args=()
[ "$rehearse" = 0 ] || profile_args=(--device cpu)
[ $# -gt 0 ] || set -- tests profile
for s in "$@"; do
    if [ "$(left)" -le 0 ]; then
        echo "== $s: skipped, the budget of $budget s is spent"; status=1; continue
    fi
    case $s in
        tests)
            limit=$(left); [ "$limit" -le "${TESTS_S:-120}" ] || limit=${TESTS_S:-120}
            # SIGINT first: pytest then prints what ran and what did not
            step tests timeout -s INT -k 20 "$limit" "$py" -m pytest tests/test_gpu.py -v -p no:cacheprovider ;;
        profile)
            step profile "$py" -m hetspec.benchmarks.gpu_profile "${profile_args[@]}" --budget-s $(($(left) - 30)) \
                --compile-limit-s 25 \
                --out "$out/profile.json" --report "$out/report.md" ;;
        cores) step cores cores ;;
        *) echo "unknown step $s (steps: tests profile cores)" >&2; exit 2 ;;
    esac
done
exit $status
