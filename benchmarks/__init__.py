"""What hetspec is measured and tried with, in three groups (benchmarks/README.md gives
each one's command):

- bench/: `hetspec-bench`, the DuoDecoding paper's protocol adapted: every method on the
  Spec-Bench prompts (data/) with one engine; report.md, results.json and plots.
- robustness/: `hetspec-chaos`, processes killed under load, and `hetspec-fuzz`, hostile
  input to every surface.
- the tools the docs send a user or developer to: mode_ab (modes taking turns on one
  engine, forced to speculate or not), target_alone (the native target against llama-bench),
  gpu_profile (a target on a GPU), shaped_gguf (a GGUF file's shape with random weights, for
  a machine the file cannot reach), and micro/ (pytest-benchmark timings of a round's pieces).

reports/ keeps committed runs, each with the command and the commit that made it.
"""
