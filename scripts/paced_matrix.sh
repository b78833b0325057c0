#!/usr/bin/env bash
# The paced-target matrix (benchmarks/reports/paced/, the README's figures): each GPU profile
# against the Qwen2.5-Coder pair's two drafts, 4 held-out code prompts x 128 tokens,
# greedy; the traces are recorded first (untimed). Needs `hetspec-models fetch qwen2.5-coder`.
# Reports in OUT/PROFILE-DRAFT (default benchmarks/reports/paced). About 20 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/reports/paced}
for profile in gpu-40ms h100-7b-eager h100-7b-captured; do
    .venv/bin/hetspec-bench --config benchmarks/configs/qwen2.5-coder-4bit-draft.toml --paced "$profile" \
        --quiet --out "$OUT/$profile-qwen0.5b"
    .venv/bin/hetspec-bench --config benchmarks/configs/qwen2.5-coder-smollm2-paced.toml --paced "$profile" \
        --quiet --out "$OUT/$profile-smollm2"
done
