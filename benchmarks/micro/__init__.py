"""pytest-benchmark micro-benchmarks of what one DuoDecoding round is made of: an IPC
round trip, a draft step, a verify pass, a target-only step, a row's draw, a whole round.
Comparing them says how much of a round is IPC and Python (benchmarks/README.md lists them).

    .venv/bin/python -m pytest benchmarks/micro          (HETSPEC_BENCH_CONFIG, HETSPEC_BENCH_DTYPE pick the models)
"""
