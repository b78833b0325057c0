"""What hetspec is measured and tried with (benchmarks/README.md gives each command): bench/
(`hetspec-bench`), robustness/ (`hetspec-chaos`, `hetspec-fuzz`), micro/ (a round's pieces timed),
and single tools: mode_ab, target_alone, concurrency (over HTTP, or --paced), gpu_profile, shaped_gguf."""
