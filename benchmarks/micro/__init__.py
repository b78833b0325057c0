"""pytest-benchmark timings of a DuoDecoding round's pieces, to say how much of a round is IPC and Python:
`.venv/bin/python -m pytest benchmarks/micro` (HETSPEC_BENCH_CONFIG, HETSPEC_BENCH_DTYPE pick the models)."""
