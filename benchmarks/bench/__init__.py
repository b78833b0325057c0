"""hetspec-bench: the DuoDecoding paper's protocol on the Spec-Bench prompts, every method
beside the engine on one machine (benchmarks/README.md).

    data        the prompts shipped in benchmarks/data/
    methods     the compared methods, by name
    settings    what a run does (engine config, limit, methods, dtype)
    baselines   transformers vanilla and prompt lookup, in-process
    llama_peer  llama.cpp through llama-cpp-python, in-process
    llama_bin   llama.cpp's own C++ binaries
    engine_runs one request to the engine as a record
    ceiling     the draft model alone, in a pinned child process
    runner      the whole suite
    metrics     per-run records -> per-category and average figures
    checks      consistency of a results document
    report      report.md, its results tables in tables.py;  plots: the PNG figures
    machine     where it ran
    cli         the hetspec-bench command
"""
