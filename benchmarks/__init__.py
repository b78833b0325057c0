"""What hetspec is measured and tried with (benchmarks/README.md gives each one's command):
bench/ (`hetspec-bench`, every method on the Spec-Bench prompts), robustness/ (`hetspec-chaos`,
`hetspec-fuzz`), micro/ (a round's pieces timed), and single tools: mode_ab, target_alone,
concurrency (over HTTP, or --paced), draft_step, lookup_replay, gpu_profile (its passes in
gpu_passes), shaped_gguf. reports/ keeps committed runs with their command and commit.
"""
