"""pytest-benchmark micro-benchmarks of what one DuoDecoding round is made of.

    .venv/bin/python -m pytest benchmarks/micro --benchmark-only          (or: pytest benchmarks/micro)

- test_ipc.py         one IPC round trip (zmq + shared memory) with a peer process:
                      a token window, and vocabulary-sized probability rows
- test_draft_step.py  one draft step (the configured backend, one token, 1 thread)
- test_verify.py      one verify pass of the target (1 token and gamma + 1 tokens, 1 thread)
- test_round.py       one whole round through the real workers: verify and draft at once,
                      then acceptance and branch choice in the scheduler

The round costs max(draft, verify) plus orchestration; comparing these numbers
says how much of a round is IPC and Python. Models come from the engine config
in HETSPEC_BENCH_CONFIG (default: the embedded SmolLM2 pair) and
HETSPEC_BENCH_DTYPE (default: the config's).
"""
