"""hetspec's benchmark suite (docs/performance.md, "How to measure"): the DuoDecoding paper's protocol, adapted.

`hetspec-bench` (hetspec.benchmarks.cli) runs every method on the Spec-Bench prompts
with one engine and writes report.md, results.json and PNG plots;
benchmarks/micro/ holds pytest-benchmark micro-benchmarks of the pieces a
round is made of (IPC round trip, draft step, verify pass, whole round).

One concept per module:
    data        the Spec-Bench prompts shipped in benchmarks/data/
    methods     the compared methods, by name
    settings    what a run does (engine config, limit, methods, dtype)
    baselines   transformers vanilla and prompt lookup, in-process
    engine_runs one request to the engine as a record
    ceiling     the draft model alone (its configured backend), in a pinned child process
    runner      the whole suite
    metrics     per-run records -> per-category and average figures
    checks      consistency of a results document
    report      report.md;  plots: the PNG figures;  machine: where it ran
    cli         hetspec-bench
"""
