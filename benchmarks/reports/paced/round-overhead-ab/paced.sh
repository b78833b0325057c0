#!/bin/bash
# One paced bench run (from the repository root); its report's draft line and table rows to stdout.
# Used as: scripts/ab_revisions.sh A B OUT 3 -- benchmarks/reports/paced/round-overhead-ab/paced.sh
d=$(mktemp -d)
.venv/bin/hetspec-bench --config benchmarks/configs/qwen2.5-coder-smollm2-paced.toml --paced gpu-40ms \
    --traces "${TRACES:-/tmp/traces}" --categories code mt_bench --limit 4 --max-new-tokens 128 \
    --methods ${METHODS:-duodec duodec-s1} --quiet --out "$d" > "$d/log" 2>&1
grep -E "^Draft:|^\| (DuoDec|Engine)" "$d/report.md" | cut -c1-400
rm -rf "$d"
