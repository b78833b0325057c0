"""What code driving llama.cpp's C API shares: opening a model and its context (llama.cpp's
log silenced), its default model parameters where they run, one batch decoded, and freeing
what it allocated."""
from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import sys

import llama_cpp

# llama.cpp logs every load step to stderr. The C side keeps this pointer: it lives as long
# as the module, so the callback is never garbage-collected under it.
_SILENT_LOG = llama_cpp.llama_log_callback(lambda level, text, user_data: None)

# A child decodes 8 tokens of the file with llama.cpp's defaults, its exit status the verdict.
_PROBE = """import os, sys, llama_cpp
silent = llama_cpp.llama_log_callback(lambda level, text, data: None)
llama_cpp.llama_log_set(silent, None)
model = llama_cpp.llama_model_load_from_file(os.fsencode(sys.argv[1]), llama_cpp.llama_model_default_params())
params = llama_cpp.llama_context_default_params()
params.n_ctx, params.n_threads, params.n_threads_batch = 64, 1, 1
ctx = llama_cpp.llama_init_from_model(model, params)
tokens = (llama_cpp.llama_token * 8)(*range(1, 9))
sys.exit(llama_cpp.llama_decode(ctx, llama_cpp.llama_batch_get_one(tokens, 8)))
"""


def open_model(path: str, context_params, model_params=None, shape: str = ""):
    """(model, context) of the GGUF file `path`; model_params default to default_model_params.
    A failure is an exception naming the file (and `shape`, the context asked for), with
    nothing left allocated."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF model file not found: {path}")
    llama_cpp.llama_log_set(_SILENT_LOG, ctypes.c_void_p(0))
    if model_params is None:
        model_params = default_model_params(path)
    model = llama_cpp.llama_model_load_from_file(os.fsencode(path), model_params)
    if not model:
        raise RuntimeError(f"llama.cpp failed to load model from {path}")
    ctx = llama_cpp.llama_init_from_model(model, context_params)
    if not ctx:
        llama_cpp.llama_model_free(model)
        raise RuntimeError(f"llama.cpp failed to create a context for {path} ({shape})")
    return model, ctx


def default_model_params(path: str):
    """llama.cpp's default model parameters for the GGUF file `path`, less its extra weight
    buffers where those crash this machine (repacked_weights_run)."""
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = repacked_weights_run(path)
    return params


@functools.cache
def repacked_weights_run(path: str) -> bool:
    """Whether llama.cpp's extra buffer types (weights repacked for its AMX or other
    kernels, on by default) can decode `path` here. Built for a CPU that reports AMX, its AMX
    kernels have died in VMs whose CPU reports AMX, where plain AMX code runs (SIGILL at
    tileloadd on a Sapphire Rapids, 2026-11-26; SIGSEGV, a general protection fault in
    libggml-cpu, on another Xeon, 2026-12-01): so a child process tries them first, and a
    child killed by any signal means no. Elsewhere they are llama.cpp's defaults and run."""
    if b"AMX_INT8 = 1" not in llama_cpp.llama_print_system_info():
        return True
    done = subprocess.run([sys.executable, "-c", _PROBE, path], capture_output=True, timeout=300, check=False,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    return done.returncode >= 0


def free(batch, ctx, model) -> None:
    """Free a batch, a context and a model, any of them None (not allocated, or freed)."""
    if batch is not None:
        llama_cpp.llama_batch_free(batch)
    if ctx:
        llama_cpp.llama_free(ctx)
    if model:
        llama_cpp.llama_model_free(model)


def decode(ctx, batch, tokens, pos: int, last_only: bool) -> None:
    """Evaluate `tokens` at positions pos.. of sequence 0 in one llama_decode call, with
    logits for every token or only the last."""
    for i, t in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0] = t, pos + i, 1, 0
        batch.logits[i] = not last_only or i == len(tokens) - 1
    batch.n_tokens = len(tokens)
    if llama_cpp.llama_decode(ctx, batch) != 0:
        raise RuntimeError(f"llama_decode failed at positions {pos}..{pos + len(tokens) - 1}")
