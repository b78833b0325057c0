#!/usr/bin/env bash
# The test suite in its full form: the tests of a sampled law draw all their samples
# (tests/helpers.py, draws), and the tests marked full run (helpers.FULL). CI runs the
# short form, .ci/run. Two test files at a time, as CI; extra arguments go to pytest (-n 0: one process).
set -euo pipefail
cd "$(dirname "$0")/.."
HETSPEC_FULL_TESTS=1 exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
