#!/usr/bin/env bash
# Both #74 cells of the paired-gate A/B, the default (duodec) once each: tok/s, code / mt_bench, outputs = trace.
# Used as, with paired-gate.patch applied and committed as B: scripts/ab_revisions.sh ce34440 B OUT 4 -- THIS_SCRIPT
cd "$(git rev-parse --show-toplevel)"
for cell in "h100-7b-eager qwen2.5-coder-4bit-draft" "gpu-40ms qwen2.5-coder-smollm2-paced"; do
  set -- $cell; d=$(mktemp -d)
  .venv/bin/hetspec-bench --config benchmarks/configs/$2.toml --paced $1 --traces "${TRACES:-/tmp/traces}" --categories code mt_bench \
     --limit 4 --max-new-tokens 128 --methods duodec --quiet --out $d > $d/log 2>&1
  echo "CELL $1 $2 $(grep -E '^\| DuoDec' $d/report.md | cut -d'|' -f3,6,11)"
  rm -rf $d
done
