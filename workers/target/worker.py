"""The target worker process: verifies windows of draft tokens with the target model.

python -m hetspec.workers.target --endpoint ENDPOINT --spec JSON   (started by hetspec.launcher)
"""
from __future__ import annotations

import dataclasses
import os
import time

import numpy as np

from hetspec.core.sampling import Rule, draw_keyed, keep_nucleus, probabilities
from hetspec.ipc.messages import (
    CalibrateTarget,
    ExportKV,
    KVExported,
    RanAhead,
    TargetCalibration,
    Verified,
    VerifyBatch,
    VerifyCommand,
    WorkerHello,
)
from hetspec.ipc.specs import GGUF_TARGET_BACKENDS, TargetSpec
from hetspec.workers.common.process import parse_args, serve
from hetspec.workers.common.thread_pinning import pin_threads, set_torch_threads
from hetspec.workers.target.devices import resolve_device

ONCE_ABOVE_S = 0.1       # a calibration pass this slow is timed once: a hiccup is small beside it


def resolve_backend(spec: TargetSpec) -> str:
    """Backend "auto": a GGUF file's own blocks (native) where the target runs one in
    float32 on the CPU (where the native kernels refuse the file, llama.cpp: _auto_fallback);
    transformers on CUDA, for a checkpoint or a random model, or in another dtype
    (docs/usage.md says why)."""
    if spec.backend != "auto":
        return spec.backend
    on_cpu = resolve_device(spec.device) == "cpu"
    return "native" if on_cpu and spec.model.gguf_file and spec.dtype in ("auto", "float32") else "transformers"


def _auto_fallback(spec: TargetSpec, why: str):
    """(backend, state) for a GGUF file the native kernels refuse, under backend "auto":
    llama.cpp, exact and of any architecture (a missing extra is an error that names it);
    transformers only where llama.cpp refuses too (float weights it multiplies otherwise
    in a batch), the file's own float32. The kernels line says why."""
    from hetspec.workers.target.gguf_target import GGUFTarget

    try:
        state = GGUFTarget(dataclasses.replace(spec, backend="llama.cpp"))
    except ValueError as exc:
        return "transformers", _transformers_target(spec, f" (backend auto: {why}; nor llama.cpp: {exc})")
    state.kernels += f" (backend auto: {why})"
    return "llama.cpp", state


def load(spec: TargetSpec):
    backend = resolve_backend(spec)
    if backend in GGUF_TARGET_BACKENDS:
        from hetspec.workers.common.native_model import Unsupported
        from hetspec.workers.kernels.build import KernelUnavailable
        from hetspec.workers.target.gguf_target import GGUFTarget, llama_backend
        if backend == "llama.cpp":
            # before threads spread: it brings llama.cpp's OpenMP runtime (the native
            # backend and a transformers target, on a GPU say, need no llama.cpp at all)
            llama_backend()
    else:
        from hetspec.workers.target import transformers_target  # torch, and its OpenMP runtime
        set_torch_threads(spec.threads)
    pin_threads(spec.cores, spec.threads)
    start = time.perf_counter()
    if backend in GGUF_TARGET_BACKENDS:
        try:
            state = GGUFTarget(dataclasses.replace(spec, backend=backend))
        except (KernelUnavailable, Unsupported) as exc:
            if spec.backend != "auto":
                raise
            backend, state = _auto_fallback(spec, f"no native target: {exc}")
    else:
        state = transformers_target.TransformersTarget(spec)
    hello = WorkerHello(role="target", pid=os.getpid(), n_vocab=state.n_vocab, device=state.device,
                        cores=spec.cores, threads=spec.threads, load_s=time.perf_counter() - start,
                        eos_token_ids=state.eos, backend=backend, kernels=state.kernels,
                        kv_geometry=state.geometry(), caches=getattr(state, "caches", spec.caches))
    return hello, state


def verify(state, cmd: VerifyCommand, buffers):
    """The verdict on a window; then, where the command asks, tokens decoded ahead."""
    start = time.perf_counter()
    logits = state.run(cmd.cache, buffers["input"].array[:cmd.n_tokens], cmd.keep, cmd.rows, cmd.borrow_cores)
    _answer(logits, cmd, buffers, 0)
    reply = Verified(cmd.request_id, time.perf_counter() - start)
    if cmd.ahead <= 0 or cmd.sampling.rule is Rule.UNKEYED:
        return reply
    return reply, run_ahead(state, cmd, int(buffers["choice"].array[cmd.rows - 1]))


def verify_batch(state, cmd: VerifyBatch, buffers) -> Verified:
    """Several requests' verdicts from one pass over all their windows (state.run_batch),
    each request's rows written after the previous one's (VerifyBatch)."""
    caches = [c.cache for c in cmd.commands]
    if len(set(caches)) < len(caches):
        raise ValueError(f"a batch runs each cache once, got caches {caches}")
    start, inputs, first, windows = time.perf_counter(), buffers["input"].array, 0, []
    for c in cmd.commands:
        windows.append((c.cache, inputs[first:first + c.n_tokens], c.keep, c.rows))
        first += c.n_tokens
    row = 0
    for c, logits in zip(cmd.commands, state.run_batch(windows, cmd.borrow_cores)):
        _answer(logits, c, buffers, row)
        row += c.rows
    return Verified(cmd.commands[0].request_id, time.perf_counter() - start)


def _answer(logits, cmd: VerifyCommand, buffers, at: int) -> None:
    """A command's answer rows from `at` on: its choices, or its laws (the unkeyed rule)."""
    rows, s = cmd.rows, cmd.sampling
    if s.rule is Rule.UNKEYED:
        buffers["probs"].array[at:at + rows] = _probabilities(logits, s)
    else:                              # row i chooses the token at position keep + n_tokens - rows + 1 + i
        buffers["choice"].array[at:at + rows] = _choose(logits, s, cmd.keep + cmd.n_tokens - rows + 1)


def run_ahead(state, cmd: VerifyCommand, token: int):
    """One pass a step, each after the last choice, while no new command has come
    (process.CommandLoop stops it): the scheduler's next target-only step is then
    answered before it asks. A step it does not take costs a pass and nothing else:
    its next command crops the cache to its own context."""
    position = cmd.keep + cmd.n_tokens          # the index of `token`, the last choice
    for _ in range(cmd.ahead):
        start = time.perf_counter()
        logits = state.run(cmd.cache, np.array([token], np.int32), position, 1, cmd.borrow_cores)
        after, token = token, int(_choose(logits, cmd.sampling, position + 1)[0])
        position += 1
        yield RanAhead(cmd.request_id, cmd.run, position, after, token, time.perf_counter() - start)


def _choose(logits, s, first: int) -> np.ndarray:
    """Each row's token, greedy or keyed (row i chooses the token at index first + i)."""
    if s.rule is Rule.GREEDY:
        return _argmax(logits)
    probs = _probabilities(logits, s)
    return np.array([draw_keyed(row, s.seed, first + i) for i, row in enumerate(probs)], np.int32)


def _argmax(logits) -> np.ndarray:
    """Each row's top token, where the logits are (a GGUF target's are a numpy array:
    numpy's argmax takes a tenth of torch's time over a 262k-token row; a transformers
    target's a torch tensor)."""
    return logits.argmax(axis=-1) if isinstance(logits, np.ndarray) else logits.argmax(dim=-1).cpu().numpy()


def _probabilities(logits, s) -> np.ndarray:
    """Each row's law, float32 on the host. A GPU's rows are scaled, cut to top-k and
    normalised where they are, so one copy brings back what sampling reads; the nucleus
    is cut on the host by core.sampling's rule. (The same steps as probabilities.)"""
    if isinstance(logits, np.ndarray) or logits.device.type == "cpu":
        return probabilities(np.asarray(logits), s.temperature, s.top_k, s.top_p)
    import torch

    x = logits.float() / s.temperature
    if s.top_k and s.top_k < x.shape[-1]:
        x = x.masked_fill(x < torch.topk(x, s.top_k, dim=-1).values[:, -1:], float("-inf"))
    return keep_nucleus(torch.softmax(x, dim=-1).cpu().numpy(), s.top_p)


def export_kv(state, cmd: ExportKV, buffers) -> KVExported:
    """The prompt's KV cache, for a draft that is a copy of this model (see workers/draft/llama_kv_state.py)."""
    start = time.perf_counter()
    state.export_kv(cmd.cache, cmd.length, buffers["kv"].array)
    return KVExported(cmd.request_id, time.perf_counter() - start)


def _transformers_target(spec: TargetSpec, why: str):
    """A transformers target where another backend was first in line: torch comes in now,
    so its threads are set and spread here."""
    from hetspec.workers.target.transformers_target import TransformersTarget

    set_torch_threads(spec.threads)
    pin_threads(spec.cores, spec.threads)
    return TransformersTarget(spec, why)


def calibrate(state, cmd: CalibrateTarget, buffers) -> TargetCalibration:
    """Fastest time of a verify pass of each size, after a context of context_len.
    (The fastest, like the draft's: a machine's hiccups only ever add time, and a
    budget set too high is trimmed round by round, one set too low is not.) A slow
    target is timed once a size, and only up to the size where its passes have
    taken budget_s: the scheduler extrapolates the rest, and start-up stays short."""
    rng = np.random.default_rng(0)
    context = rng.integers(0, state.n_vocab, cmd.context_len)
    state.run(0, context, 0, 1, borrow=cmd.borrow_cores)
    def timed(window) -> float:
        start = time.perf_counter()
        # every row's logits, as a verify window asks: the output layer is part of its cost
        state.run(0, window, cmd.context_len, len(window), cmd.borrow_cores)[-1, 0].item()   # .item(): wait for a GPU
        return time.perf_counter() - start

    seconds, spent = [], 0.0
    for n in cmd.sizes:
        window = rng.integers(0, state.n_vocab, n)
        times = [timed(window)]
        if times[0] <= ONCE_ABOVE_S:
            times += [timed(window), timed(window)]
        seconds.append(min(times))
        spent += sum(times)
        if cmd.budget_s and spent >= cmd.budget_s:
            break
    return TargetCalibration(seconds)


def recover(state) -> None:
    """After a command failed: the caches it ran on may be half written, so they go (the
    requests they belonged to have failed; the next ones given those caches start afresh)."""
    state.forget()


def main(argv=None) -> int:
    endpoint, spec = parse_args(argv, TargetSpec)
    if spec.backend == "paced":          # a simulated GPU target: no model, recorded traces
        from hetspec.workers.target import paced

        return serve("target", endpoint, spec, paced.load, paced.HANDLERS, paced.recover)
    return serve("target", endpoint, spec, load, {VerifyCommand: verify, VerifyBatch: verify_batch,
                                                  CalibrateTarget: calibrate, ExportKV: export_kv}, recover)

