#!/usr/bin/env bash
# The GPU checks: on a machine with an NVIDIA GPU and hetspec set up, from anywhere.
#   scripts/gpu_check.sh [STEP ...]     steps: tests profile bench (default: all three)
# tests:   tests/test_gpu.py (exactness and sampling with the target on cuda)
# profile: benchmarks/gpu_profile.py (a Llama-2-7B-shaped bfloat16 target: verify costs,
#          the budget, the rounds, against its plain generate)
# bench:   hetspec-bench on the default pair with its target on the GPU
# Each step's log, and the reports, go to $OUT (default gpu-out). Exits 1 if a step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-out}
py=${PYTHON:-python3}
mkdir -p "$out"
status=0

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
            step bench "$py" -m hetspec.benchmarks.cli --config benchmarks/configs/smollm2-cuda.toml \
                --out "$out/bench" --quiet ;;
        *) echo "unknown step $s (steps: tests profile bench)" >&2; exit 2 ;;
    esac
done
exit $status
