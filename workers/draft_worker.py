"""The draft worker process: drafts windows (and branches) with the draft model.

python -m workers.draft_worker --endpoint ENDPOINT --spec JSON
"""
from __future__ import annotations

import os
import time

import numpy as np

from ipc.messages import CalibrateDraft, DraftCalibration, DraftCommand, Drafted, DraftExtended, WorkerHello
from workers.drafting import Drafter, DraftParams
from workers.pinning import borrowed_cores, pin, pin_threads, set_torch_threads
from workers.process import exit_now, parse_args, serve


class DraftState:
    def __init__(self, spec: dict):
        self.backend = spec["backend"]          # what runs the draft: native, llama.cpp or torch
        if self.backend in ("native", "llama.cpp"):
            self.model, self.kernels = _load_native(spec) if self.backend == "native" else (None, "")
            if self.model is None:
                self.backend = "llama.cpp"
                self.model, llama = _load_llama_cpp(spec)
                self.kernels = llama + (f" ({self.kernels})" if self.kernels else "")
            self.kv_geometry = self.model.kv_geometry() if spec.get("prompt_kv") == "auto" else []
        else:
            from workers.torch_draft_model import TorchDraftModel

            set_torch_threads(spec["threads"])
            self.model = TorchDraftModel(spec["model"])
            self.kernels = "torch"
            self.kv_geometry = []
        self.drafter = Drafter(self.model, spec["n_ctx"])
        self.request_id = None
        self.cores, self.threads = spec["cores"], spec["threads"]
        self.lent = spec.get("borrow_cores", [])

    def prefill(self, context: np.ndarray, reuse_cache: bool, borrow: bool, kv=None, kv_length: int = 0) -> None:
        """Catch up with context, on the target's cores too when lent (the target waits
        meanwhile); with kv_length, the first kv_length tokens' cache is the target's."""
        if kv_length:
            self.model.import_kv(kv[0, :, :, :kv_length], kv[1, :, :, :kv_length])
            self.drafter.adopt(context[:kv_length])
        with borrowed_cores(self.cores, self.lent if borrow else [], self.model.set_threads, self.threads):
            self.drafter.sync(context, reuse_cache or kv_length > 0)


def _load_native(spec: dict):
    """(the native draft, its description), or (None, why not) when this CPU,
    compiler or file cannot run it: llama.cpp drafts instead."""
    from workers.native_draft import KernelUnavailable, NativeDraftModel, Unsupported

    model = spec["model"]
    cache = model.get("cache_dir")
    try:
        native = NativeDraftModel(os.path.join(model["path"], model["gguf_file"]), spec["n_ctx"],
                                  os.path.dirname(cache) if cache else "")
    except (KernelUnavailable, Unsupported) as exc:
        return None, f"no native draft: {exc}"
    return native, native.description


def _load_llama_cpp(spec: dict):
    model = _load_gguf(spec, spec["weights"])
    kernels = f"llama.cpp, weights {spec['weights']}"
    prefill = spec.get("prefill_weights", "same")
    if prefill != "same":
        from workers.split_prefill import SplitPrefillModel

        model = SplitPrefillModel(model, _load_gguf(spec, prefill))
        kernels += f", prompts prefilled as {prefill}"
    return model, kernels


def _load_gguf(spec: dict, weights: str):
    """The draft GGUF in llama.cpp, converted to `weights` first unless "as-is"."""
    from workers.llama_cpp_model import LlamaCppModel

    model = spec["model"]
    path = os.path.join(model["path"], model["gguf_file"])
    converted = weights != "as-is"
    if converted:
        from workers.gguf_conversion import convert_gguf

        path = convert_gguf(path, weights, spec["scratch_dir"], spec["threads"])
    try:
        return LlamaCppModel(path, n_ctx=spec["n_ctx"], n_threads=spec["threads"])
    finally:
        if converted:   # llama.cpp holds the weights in memory now
            os.unlink(path)


def load(spec: dict):
    pin(spec["cores"])
    start = time.perf_counter()
    state = DraftState(spec)
    pin_threads(spec["cores"], spec["threads"])   # the model's thread pool exists now
    hello = WorkerHello(role="draft", pid=os.getpid(), n_vocab=state.model.n_vocab, device="cpu",
                        cores=spec["cores"], threads=spec["threads"], load_s=time.perf_counter() - start,
                        kernels=state.kernels, kv_geometry=state.kv_geometry,
                        prefill_threads=state.backend != "native")   # it prefills one token a pass
    return hello, state


def draft(state: DraftState, cmd: DraftCommand, buffers) -> Drafted:
    start = time.perf_counter()
    if cmd.request_id != state.request_id:   # a new request: its own random stream
        state.request_id = cmd.request_id
        state.drafter.rng = np.random.default_rng([cmd.seed, 1])
    context = buffers["context"].array[:cmd.context_len]
    if cmd.n_tokens == 0:                    # only bring the cache up to date (prefill)
        kv = buffers["kv"].array if "kv" in buffers else None   # shared with the target, when handing over
        state.prefill(context, cmd.reuse_cache, cmd.borrow_cores, kv, cmd.kv_length)
        return Drafted(cmd.request_id, cmd.slot, [], time.perf_counter() - start, 1)
    params = DraftParams(cmd.n_tokens, cmd.speculative, cmd.sequences, cmd.max_sequences,
                         cmd.temperature, cmd.top_p, cmd.top_k, cmd.acceptance)
    out = state.drafter.draft(context, params)
    # The likeliest branch (the drafter's first) goes last in the slot, where an extension can grow it.
    branches, probs = out.branches[::-1], out.probs[::-1]
    flat = [t for branch in branches for t in branch]
    tokens = buffers["tokens"].array[cmd.slot]
    tokens[:len(flat)] = flat
    if probs:
        buffers["probs"].array[cmd.slot, :len(flat)] = np.concatenate([np.stack(rows) for rows in probs])
    reply = Drafted(cmd.request_id, cmd.slot, [len(b) for b in branches], time.perf_counter() - start,
                    out.forward_passes)
    room = len(tokens) - (len(flat) - len(branches[-1]))      # the likeliest branch may grow to this
    limit = min(cmd.extend_to, room)
    if not cmd.speculative or limit <= len(branches[-1]):
        return reply
    return reply, _extension(state, cmd, buffers, len(flat), limit, start)


def _extension(state: DraftState, cmd: DraftCommand, buffers, total: int, limit: int, start: float):
    """Work between commands: the likeliest branch grows a token at a time, each
    written to the slot before the message that announces it."""
    for token, row in state.drafter.extend(limit):
        buffers["tokens"].array[cmd.slot, total] = token
        if cmd.temperature > 0:
            buffers["probs"].array[cmd.slot, total] = row
        total += 1
        yield DraftExtended(cmd.command, cmd.slot, total, time.perf_counter() - start)


def calibrate(state: DraftState, cmd: CalibrateDraft, buffers) -> DraftCalibration:
    """Time per drafted token after a context of context_len tokens (greedy): the
    fastest of `repeats` drafts, spread over the target's own calibration."""
    rng = np.random.default_rng(0)
    context = rng.integers(0, state.model.n_vocab, cmd.context_len).astype(np.int32)
    params = DraftParams(cmd.n_tokens, False, 1, 1, 0.0, 1.0, 0)
    best = float("inf")
    for _ in range(max(1, cmd.repeats)):
        state.drafter.sync(context)
        start = time.perf_counter()
        state.drafter.draft(context, params)
        best = min(best, (time.perf_counter() - start) / cmd.n_tokens)
    return DraftCalibration(best)


def main(argv=None) -> int:
    spec = parse_args(argv)
    return serve("draft", spec, load, {DraftCommand: draft, CalibrateDraft: calibrate})


if __name__ == "__main__":
    exit_now(main())
