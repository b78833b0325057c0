"""llama.cpp decoding the target's own GGUF file in the benchmark process (llama-cpp-python's C API,
llama.cpp's defaults): what a CPU user would run instead. Greedy takes each step's argmax with numpy;
sampling uses llama.cpp's sampler chain (temperature, top-p, a seeded draw: the engine's law). Prompt
lookup (`pld`, greedy) verifies its guesses in one batch, whose logits are not the one-token ones.
"""
from __future__ import annotations

import os
import time

import llama_cpp
import numpy as np

from hetspec.benchmarks.bench.baselines import BaselineRun
from hetspec.benchmarks.bench.llama_bin import repack_note
from hetspec.workers.common.llama_handles import decode, free, open_model, repacked_weights_run

PLD_MAX, PLD_NGRAM = 10, 3          # llama.cpp's lookup example drafts about as many


class LlamaPeer:
    def __init__(self, path: str, n_ctx: int, eos: list[int]):
        self.cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
        self.repacked = repacked_weights_run(path)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, 512, 512
        params.n_threads = params.n_threads_batch = len(self.cores)
        self.model, self.ctx = open_model(path, params)
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))
        self.batch = llama_cpp.llama_batch_init(512, 0, 1)
        self.eos = set(eos)

    def resources(self, threads: int | None) -> dict:
        return {"device": "cpu", "cores": self.cores, "threads": threads or len(self.cores), "dtype": "gguf",
                "settings": repack_note(self.repacked)}

    def run(self, mode: str, threads: int | None, prompt_ids: list[int], max_new_tokens: int,
            temperature: float = 0.0, top_p: float = 1.0, seed: int = 0) -> BaselineRun:
        """One generation: mode "plain" or "pld" (greedy only; sampled, it decodes plainly)."""
        n = threads or len(self.cores)
        llama_cpp.llama_set_n_threads(self.ctx, n, n)
        llama_cpp.llama_memory_clear(self.mem, True)
        sampler = self._sampler(temperature, top_p, seed) if temperature > 0 else None
        try:
            start = time.perf_counter()
            for at in range(0, len(prompt_ids), 512):
                decode(self.ctx, self.batch, prompt_ids[at:at + 512], at, last_only=True)
            run = self._pld(prompt_ids, max_new_tokens, start) if mode == "pld" and sampler is None else \
                self._plain(prompt_ids, max_new_tokens, sampler, start)
        finally:
            if sampler is not None:
                llama_cpp.llama_sampler_free(sampler)
        return run

    def _plain(self, prompt_ids, max_new_tokens, sampler, start) -> BaselineRun:
        tokens, first_at = [], None
        while True:
            token = self._argmax(-1) if sampler is None else llama_cpp.llama_sampler_sample(sampler, self.ctx, -1)
            tokens.append(int(token))
            first_at = first_at or time.perf_counter()
            if token in self.eos or len(tokens) == max_new_tokens:
                break
            decode(self.ctx, self.batch, [token], len(prompt_ids) + len(tokens) - 1, last_only=True)
        return self._finish(tokens, start, first_at, rounds=len(tokens))

    def _pld(self, prompt_ids, max_new_tokens, start) -> BaselineRun:
        context, tokens, first_at = list(prompt_ids), [], None
        rounds = spec_rounds = drafted = accepted_total = 0
        token = self._argmax(-1)
        while True:
            tokens.append(token)
            context.append(token)
            first_at = first_at or time.perf_counter()
            if token in self.eos or len(tokens) == max_new_tokens:
                break
            draft = _lookup(context, min(PLD_MAX, max_new_tokens - len(tokens)))
            decode(self.ctx, self.batch, [token, *draft], len(context) - 1, last_only=False)
            accepted = self._accepted(draft)
            rounds, spec_rounds = rounds + 1, spec_rounds + bool(draft)
            drafted, accepted_total = drafted + len(draft), accepted_total + accepted
            tokens += draft[:accepted]
            context += draft[:accepted]
            llama_cpp.llama_memory_seq_rm(self.mem, 0, len(context), -1)   # the rejected tail
            if len(tokens) >= max_new_tokens:
                tokens = tokens[:max_new_tokens]
                break
            token = self._argmax(accepted)
        run = self._finish(tokens, start, first_at, rounds=rounds)
        run.spec_rounds, run.drafted, run.accepted, run.gamma = spec_rounds, drafted, accepted_total, PLD_MAX
        run.committed_in_spec_rounds = accepted_total + spec_rounds
        return run

    def _accepted(self, draft: list[int]) -> int:
        """How many draft tokens the batch's logits agree with, in order (an EOS ends them)."""
        return next((i for i, t in enumerate(draft) if self._argmax(i) != t or t in self.eos), len(draft))

    def _finish(self, tokens, start, first_at, rounds) -> BaselineRun:
        total = time.perf_counter() - start
        finish = "eos" if tokens and tokens[-1] in self.eos else "length"
        return BaselineRun(tokens, total, (first_at or time.perf_counter()) - start, finish, rounds=rounds)

    def _argmax(self, row: int) -> int:
        logits = llama_cpp.llama_get_logits_ith(self.ctx, row)
        return int(np.argmax(np.ctypeslib.as_array(logits, shape=(self.n_vocab,))))

    @staticmethod
    def _sampler(temperature: float, top_p: float, seed: int):
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(temperature))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_p(top_p, 1))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        return chain

    def close(self) -> None:
        free(self.batch, self.ctx, self.model)


def _lookup(context: list[int], limit: int) -> list[int]:
    """Up to `limit` tokens that followed the latest earlier occurrence of the context's last n-gram
    (n = PLD_NGRAM down to 1)."""
    for n in range(PLD_NGRAM, 0, -1):
        found = (s for s in range(len(context) - n - 1, -1, -1) if context[s:s + n] == context[-n:])
        start = next(found, None)
        if start is not None:
            return context[start + n:start + n + limit]
    return []
