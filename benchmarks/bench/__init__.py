"""hetspec-bench: the DuoDecoding paper's protocol on the Spec-Bench prompts, every method beside the
engine on one machine (benchmarks/README.md). runner.py runs the suite: data (prompts), methods,
settings, baselines (transformers), llama_bin (llama.cpp's C++ binaries); metrics, checks, report
(tables) and machine make results.json and report.md; cli is the command. paced.py is `--paced`;
served.py serves concurrency.py and hetspec-fuzz."""
