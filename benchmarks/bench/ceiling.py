"""The draft model alone, greedy, as the engine runs it: DuoDecoding commits at best as fast as its draft
drafts, so this is its ceiling. A child process pinned like the draft worker, after the engine stopped.

python -m hetspec.benchmarks.bench.ceiling < job.json    (measure_ceiling's arguments; prints one JSON object)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def measure_ceiling(model_file: str, cores: list[int], threads: int, prompts: list[dict], weights: str = "as-is",
                    timeout_s: float = 900, backend: str = "llama.cpp") -> dict:
    """The child's JSON result (or an "error"); backend and weights: the draft's, as in the engine."""
    n_ctx = max(len(p["ids"]) + p["max_new_tokens"] for p in prompts) + 8
    job = {"model_file": model_file, "cores": cores, "threads": threads, "n_ctx": n_ctx, "prompts": prompts,
           "weights": weights, "backend": backend}
    try:
        done = subprocess.run([sys.executable, "-m", "hetspec.benchmarks.bench.ceiling"], input=json.dumps(job),
                              capture_output=True, text=True, timeout=timeout_s,
                              env=dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads)),
                              check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]}
    return json.loads(done.stdout)


def _run(model_file: str, cores: list[int], threads: int, n_ctx: int, prompts: list[dict], weights: str,
         backend: str) -> dict:
    import tempfile

    import numpy as np

    from hetspec.ipc.specs import DraftSpec
    from hetspec.models import resolve_model
    from hetspec.workers.common.thread_pinning import pin
    from hetspec.workers.draft.worker import DraftState

    pin(cores)
    with tempfile.TemporaryDirectory(prefix="hetspec-ceiling-") as scratch:     # loaded by the draft worker's code
        state = DraftState(DraftSpec(backend=backend, model=resolve_model(model_file, "draft"), cores=[],
                                     threads=threads, n_ctx=n_ctx, weights=weights, scratch_dir=scratch))
    model, backend = state.model, state.backend
    decoded = prefilled = 0
    decode_s = prefill_s = 0.0
    try:
        model.forward(prompts[0]["ids"][:8], 0)           # warm-up: first-call allocations
        for prompt in prompts:
            start = time.perf_counter()
            token, pos = int(np.argmax(model.forward(prompt["ids"], 0))), len(prompt["ids"])
            prefill_s, prefilled = prefill_s + time.perf_counter() - start, prefilled + pos
            start = time.perf_counter()
            for _ in range(prompt["max_new_tokens"] - 1):  # the first token came with the prefill
                token = int(np.argmax(model.forward([token], pos)))
                pos, decoded = pos + 1, decoded + 1
            decode_s += time.perf_counter() - start
    finally:
        model.close()
    return {"backend": backend, "model": model_file, "weights": "as-is" if backend == "native" else weights,
            "cores": cores, "threads": threads, "prompts": len(prompts), "decoded_tokens": decoded,
            "tokens_per_s": decoded / decode_s if decode_s else 0.0,
            "ms_per_token": 1000 * decode_s / decoded if decoded else 0.0,
            "prefill_ms_per_token": 1000 * prefill_s / prefilled if prefilled else 0.0}


def main() -> int:
    print(json.dumps(_run(**json.load(sys.stdin))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
