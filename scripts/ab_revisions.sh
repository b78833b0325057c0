#!/usr/bin/env bash
# Two revisions of the engine taking turns on one command, so that the machine's drift
# falls on both alike: for each repeat, the engine's code (hetspec/, workers/, ipc/) of
# A then B (B then A on even repeats) is put in place and the command runs; its output
# goes to OUT/A.N.log and OUT/B.N.log. The tree's own code comes back at the end, whatever happens. Commit first:
# the engine's folders must have no uncommitted change.
#   scripts/ab_revisions.sh A B OUT REPEATS -- COMMAND...
#   scripts/ab_revisions.sh e7e822d HEAD /tmp/ab 3 -- .venv/bin/python -m hetspec.benchmarks.mode_ab --limit 4
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 6 ] && [ "$5" = "--" ] || { echo "usage: $0 A B OUT REPEATS -- COMMAND..." >&2; exit 2; }
A=$(git rev-parse --short "$1"); B=$(git rev-parse --short "$2"); OUT=$3; REPEATS=$4; shift 5
CODE=(hetspec workers ipc)
[ -z "$(git status --porcelain -- "${CODE[@]}")" ] || { echo "$0: commit the changes to ${CODE[*]} first" >&2; exit 2; }
mkdir -p "$OUT"
restore() {   # HEAD's code; a file only the other revision has goes (reset unstages it, clean removes it)
    git reset -q -- "${CODE[@]}" && git checkout -q HEAD -- "${CODE[@]}" && git clean -qfd -- "${CODE[@]}"
}
trap restore EXIT
for n in $(seq "$REPEATS"); do
    order=("$A" "$B"); [ $((n % 2)) -eq 0 ] && order=("$B" "$A")
    for rev in "${order[@]}"; do
        restore && git checkout -q "$rev" -- "${CODE[@]}"
        echo "== $rev, repeat $n: $*" | tee "$OUT/$rev.$n.log"
        "$@" >> "$OUT/$rev.$n.log" 2>&1 || echo "(exit $?)" >> "$OUT/$rev.$n.log"
        tail -n 4 "$OUT/$rev.$n.log"
    done
done
