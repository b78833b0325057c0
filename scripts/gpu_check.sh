#!/usr/bin/env bash
# The GPU checks: on a machine with an NVIDIA GPU and hetspec set up, from anywhere.
#   scripts/gpu_check.sh [STEP ...]     steps: tests profile bench cores (default: the first three)
# tests:   tests/test_gpu.py (exactness and sampling with the target on cuda)
# profile: benchmarks/gpu_profile.py (a Llama-2-7B-shaped bfloat16 target: verify costs,
#          the budget, the rounds, against its plain generate)
# bench:   hetspec-bench on the default pair with its target on the GPU
# cores:   the native target alone against llama.cpp's own loop on this machine's CPU cores
#          (benchmarks/target_alone.py at 2 threads, 8 and all of them; CORES_THREADS sets
#          them), on files shaped like the ones packed (random weights: speed only)
# A lent machine fetches nothing: scripts/gpu_pack.sh packs .gpu/ here (wheels, llama.cpp's
# sources, the GGUF headers); carried there, it is installed before the steps, and the
# tree is put on PYTHONPATH as the package hetspec.
# Each step's log, and the reports, go to $OUT (default gpu-out). Exits 1 if a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
py=${PYTHON:-python3}
mkdir -p "$out"
status=0

if [ -d .gpu ]; then      # a lent machine: the carried wheels, and this tree as hetspec
    site=/tmp/hetspec-site
    rm -rf "$site" && mkdir -p "$site"
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .gpu/wheels/*.whl
    cp -r hetspec "$site/hetspec" && cp -r ipc "$site/hetspec/ipc" && cp -r workers "$site/hetspec/workers" \
        && cp -r benchmarks "$site/hetspec/benchmarks"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONSAFEPATH=1   # not ./hetspec, a part of it
fi

cores() {   # build llama.cpp from .gpu's sources, expand the headers, time both
    local bin shaped=/tmp/hetspec-shaped models=() h
    bin=$(LLAMA_CPP_SDIST=.gpu/llama.cpp.tar.gz LLAMA_CPP_VERSION=$(cat .gpu/VERSION) PYTHON="$py" \
        scripts/build_llama_cpp.sh | tail -1) || return 1
    mkdir -p "$shaped"
    for h in .gpu/headers/*.gz; do
        "$py" -m hetspec.benchmarks.shaped_gguf expand "$h" "$shaped/shaped-$(basename "$h" .gz)" || return 1
        models+=(--model "$shaped/shaped-$(basename "$h" .gz)")
    done
    lscpu | grep -E "Model name|^CPU\(s\)|Thread|Flags" | cut -c1-400
    # shellcheck disable=SC2086
    HETSPEC_LLAMA_BIN=$bin "$py" -m hetspec.benchmarks.target_alone "${models[@]}" \
        --threads ${CORES_THREADS:-2 8 $(nproc)} --out "$out/cores"
}

step() {   # NAME COMMAND...: the command's output in $out/NAME.log, its tail here
    local name=$1 start=$SECONDS rc
    shift
    echo "== $name: $*"
    "$@" >"$out/$name.log" 2>&1
    rc=$?
    echo "== $name: exit $rc after $((SECONDS - start)) s"
    tail -n 30 "$out/$name.log"
    [ "$rc" -eq 0 ] || status=1
}

[ $# -gt 0 ] || set -- tests profile bench
for s in "$@"; do
    case $s in
        tests) step tests "$py" -m pytest tests/test_gpu.py -v -p no:cacheprovider ;;
        profile) step profile "$py" -m hetspec.benchmarks.gpu_profile --out "$out/profile.json" ;;
        bench)
            step bench "$py" -m hetspec.benchmarks.bench.cli --config benchmarks/configs/smollm2-cuda.toml \
                --out "$out/bench" --quiet ;;
        cores) step cores cores ;;
        *) echo "unknown step $s (steps: tests profile bench cores)" >&2; exit 2 ;;
    esac
done
exit $status
