"""Is llama.cpp batch-invariant? Its logits for a verify window, against one-token passes.

For each GGUF file and each setting of the knobs the installed build exposes
(flash attention, weight repacking, and ggml's tiled K-quant
products, switched by the GGML_CPU_TILED_MM environment variable), this evaluates a prompt, then a continuation
of 32 tokens one at a time (the reference), then the same tokens as windows of 1..32
tokens and as a 12-token window chunked 4+4+4 and 8+4. A window is batch-invariant
when every one of its rows equals the reference row bit for bit. It also times
decoding (one token a pass) in each setting, since a knob that costs speed is no help.

    python -m hetspec.benchmarks.llama_invariance --out benchmarks/reports/llama-invariance
"""
from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import llama_cpp
import numpy as np

from hetspec.benchmarks.machine import describe_machine
from hetspec.models import resolve_model
from hetspec.workers.common.llama_handles import decode, repacked_weights_run

PROMPT = ("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n"
          "        return n\n    a, b = 0, 1\n    for _ in range(n - 1):\n")
CONTINUATION = 32
WINDOWS = (1, 2, 3, 4, 5, 7, 8, 12, 13, 16, 24, 32)
CHUNKINGS = ((12,), (4, 4, 4), (8, 4), (1,) * 12)
# (name, flash_attn_type, use_extra_bufts, tiled K-quant products): llama.cpp's defaults first
SETTINGS = (("defaults (flash auto, repack on, tiled on)", -1, True, True), ("flash off", 0, True, True),
            ("repack off", -1, False, True), ("tiled off", -1, True, False),
            ("repack off, tiled off", -1, False, False), ("flash off, repack off, tiled off", 0, False, False))

_SILENT = llama_cpp.llama_log_callback(lambda level, text, user_data: None)


class Session:
    """One model and context, driven a batch at a time with every row's logits kept."""

    def __init__(self, path: str, flash: int, repack: bool, threads: int):
        llama_cpp.llama_log_set(_SILENT, ctypes.c_void_p(0))
        mparams = llama_cpp.llama_model_default_params()
        mparams.use_extra_bufts = repack
        self.model = llama_cpp.llama_model_load_from_file(os.fsencode(path), mparams)
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch, cparams.n_seq_max = 1024, 512, 512, 1
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.flash_attn_type, cparams.swa_full = flash, True
        self.ctx = llama_cpp.llama_init_from_model(self.model, cparams)
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(512, 0, 1)

    def tokenize(self, text: str) -> list[int]:
        raw = text.encode()
        out = (llama_cpp.llama_token * (len(raw) + 8))()
        n = llama_cpp.llama_tokenize(self.vocab, raw, len(raw), out, len(out), True, False)
        return list(out[:n])

    def decode(self, tokens: list[int], pos: int, last_only: bool = False) -> np.ndarray:
        """Drop positions >= pos, evaluate tokens in one call; every row's logits, or the last
        one's (a copy)."""
        llama_cpp.llama_memory_seq_rm(self.mem, 0, pos, -1)
        decode(self.ctx, self.batch, tokens, pos, last_only)
        rows = llama_cpp.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(rows, shape=(1 if last_only else len(tokens), self.n_vocab)).copy()

    def close(self) -> None:
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)
        llama_cpp.llama_model_free(self.model)


def measure(path: str, flash: int, repack: bool, tiled: bool, threads: int) -> dict:
    """In a process of its own: ggml reads GGML_CPU_TILED_MM once, at its first product."""
    os.environ["GGML_CPU_TILED_MM"] = "1" if tiled else "0"
    s = Session(path, flash, repack, threads)
    try:
        prompt = s.tokenize(PROMPT)
        p = len(prompt)
        s.decode(prompt, 0)
        # the reference: the greedy continuation, one token a pass
        rows, tokens = [], []
        start = time.perf_counter()
        token = int(np.argmax(s.decode(prompt[-1:], p - 1)[0]))
        for i in range(CONTINUATION):
            tokens.append(token)
            rows.append(s.decode([token], p + i)[0])
            token = int(np.argmax(rows[-1]))
        decode_s = (time.perf_counter() - start) / (CONTINUATION + 1)
        reference = np.stack(rows)

        def compare(got: np.ndarray, first: int) -> dict:
            want = reference[first:first + len(got)]
            return {"bitwise": bool(np.array_equal(got.view(np.uint32), want.view(np.uint32))),
                    "max_abs_diff": float(np.abs(got - want).max()),
                    "argmax_flips": int((got.argmax(1) != want.argmax(1)).sum())}

        windows = {}
        for w in WINDOWS:
            windows[w] = compare(s.decode(tokens[:w], p), 0)
        chunkings = {}
        for chunks in CHUNKINGS:
            got, at = [], 0
            for c in chunks:
                got.append(s.decode(tokens[at:at + c], p + at))
                at += c
            chunkings["+".join(map(str, chunks))] = compare(np.concatenate(got), 0)
        start = time.perf_counter()
        for _ in range(3):
            s.decode(tokens[:12], p)
        window_s = (time.perf_counter() - start) / 3
        return {"prompt_tokens": p, "decode_tok_s": 1 / decode_s, "window12_s": window_s,
                "windows": windows, "chunkings": chunkings}
    finally:
        s.close()


def report(results: dict) -> str:
    lines = ["# Is llama.cpp batch-invariant?", "",
             (f"`{results['command']}`; llama-cpp-python {results['llama_cpp_python']}, {results['threads']} thread, "
             f"{results['machine']['cpu']}, git {results['machine']['git_commit']}."), "",
             ("A prompt, then its greedy continuation of 32 tokens one token a pass (the reference). Then the same "
             "tokens as one window of w tokens, and a 12-token window in chunks. *Bitwise* means every row of every "
             "window equals its reference row bit for bit."), "",
             "| file | setting | decode tok/s | windows bitwise (of w = " + ", ".join(map(str, WINDOWS)) + ") | "
             "largest logit difference | argmax flips | chunkings bitwise |", "|---|---|---|---|---|---|---|"]
    for name, settings in results["files"].items():
        for setting, r in settings.items():
            if "skipped" in r:
                lines.append(f"| {name} | {setting} | skipped: {r['skipped']} | | | | |")
                continue
            w = r["windows"]
            same = [str(k) for k, v in w.items() if v["bitwise"]]
            chunk = [k for k, v in r["chunkings"].items() if v["bitwise"]]
            lines.append(f"| {name} | {setting} | {r['decode_tok_s']:.1f} | {', '.join(same) or 'none'} | "
                         f"{max(v['max_abs_diff'] for v in w.values()):.3g} | "
                         f"{sum(v['argmax_flips'] for v in w.values())} | {', '.join(chunk) or 'none'} |")
    lines += ["", ("The engine's llama.cpp target runs the setting that is bitwise on both files at full speed: flash "
              "attention on, repacking off, tiled K-quant products off, at most 32 tokens a pass "
              "(workers/target/llama_target.py). Float weight matrices (F32, F16, BF16; neither shipped file has "
              "one) stay batch-dependent in a build with llamafile's sgemm: tests/test_llama_target.py.")]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("llama-invariance"))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    files = {"SmolLM2-135M-Instruct Q4_1": "builtin:smollm2", "Gemma 3 270M Q4_K_M": "builtin:gemma3-270m"}
    results = {"command": "python -m hetspec.benchmarks.llama_invariance", "threads": args.threads,
               "llama_cpp_python": llama_cpp.__version__, "machine": describe_machine(), "files": {}}
    for name, builtin in files.items():
        spec = resolve_model(builtin, "target")
        path = str(Path(spec.path) / spec.gguf_file)
        repacked = repacked_weights_run(path)      # else they die of SIGILL here: measure the others
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
            results["files"][name] = {
                setting: pool.submit(measure, path, flash, repack, tiled, args.threads).result()
                if repacked or not repack else {"skipped": "llama.cpp's repacked weights die of SIGILL on this CPU"}
                for setting, flash, repack, tiled in SETTINGS}
        print(name, "done", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    (args.out / "report.md").write_text(report(results))
    print(report(results))


if __name__ == "__main__":
    main()
