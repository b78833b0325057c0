"""The transformers baselines in the benchmark process: vanilla `generate` (every speedup's
denominator) and prompt lookup (PLD). They load the target as the engine's target worker does,
in its dtype, so methods differ in decoding only; they may use every core while the engine idles.
"""
from __future__ import annotations

import contextlib
import io
import os
import time
from dataclasses import dataclass

import torch

from hetspec.models import resolve_model
from hetspec.workers.common.hf_loading import eos_token_ids, load_causal_lm

PLD_NUM_TOKENS = 10    # transformers' documented default for prompt lookup


@dataclass
class BaselineRun:
    """One in-process generation (the baselines', the llama.cpp peer's)."""
    token_ids: list[int]
    total_s: float
    ttft_s: float
    finish_reason: str
    drafted: int = 0
    accepted: int = 0
    spec_rounds: int = 0            # prompt lookup's rounds that verified at least one guessed token
    committed_in_spec_rounds: int = 0
    rounds: int = 0
    gamma: int | None = None        # prompt lookup's most guessed tokens a round (None: no lookup)

    def record(self) -> dict:
        """The run's fields of a results.json record."""
        return {"token_ids": self.token_ids, "new_tokens": len(self.token_ids), "finish_reason": self.finish_reason,
                "total_s": self.total_s, "ttft_s": self.ttft_s, "rounds": self.rounds, "spec_rounds": self.spec_rounds,
                "drafted": self.drafted, "accepted": self.accepted,
                "committed_in_spec_rounds": self.committed_in_spec_rounds, "gamma": self.gamma}


class _FirstTokenClock:
    """A generate() streamer: the first put() is the prompt, the second the first new token."""

    def __init__(self):
        self.calls = 0
        self.first_token_at: float | None = None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2 and self.first_token_at is None:
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        pass


class _PldCounter:
    """Counts PLD's proposals and matches by wrapping PromptLookupCandidateGenerator's
    get_candidates / update_candidate_strategy (class attributes, restored after)."""

    def __init__(self):
        self.rounds = self.spec_rounds = self.drafted = self.accepted = self.committed = 0
        self._last = 0

    @contextlib.contextmanager
    def counting(self):
        from transformers.generation.candidate_generator import PromptLookupCandidateGenerator as G

        get, update = G.get_candidates, G.update_candidate_strategy
        counter = self

        def get_candidates(self, input_ids, *args, **kwargs):
            ids, logits = get(self, input_ids, *args, **kwargs)
            counter._last = ids.shape[1] - input_ids.shape[1]
            counter.rounds += 1
            return ids, logits

        def update_candidate_strategy(self, input_ids, scores, num_matches):
            if counter._last > 0:
                counter.spec_rounds += 1
                counter.drafted += counter._last
                counter.accepted += int(num_matches)
                counter.committed += int(num_matches) + 1
            return update(self, input_ids, scores, num_matches)

        G.get_candidates, G.update_candidate_strategy = get_candidates, update_candidate_strategy
        try:
            yield self
        finally:
            G.get_candidates, G.update_candidate_strategy = get, update


class Baselines:
    def __init__(self, model_spec: str, dtype: str, device: str, extra_eos: set[int] = frozenset(),
                 threads: int | None = None):
        """Load the target; `extra_eos`: the tokenizer's EOS, as the engine adds; threads None: choose_threads() may."""
        self.device = device
        self.dtype = dtype
        self.cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.thread_trial: dict[str, float] = {}
        if device == "cpu":
            torch.set_num_threads(threads or max(1, len(self.cores) or os.cpu_count() or 1))
        self.threads = torch.get_num_threads()
        with contextlib.redirect_stderr(io.StringIO()):   # the GGUF loader's own progress bar
            self.model = load_causal_lm(resolve_model(model_spec, "target"), dtype, device)
        self.eos = sorted(set(eos_token_ids(self.model)) | set(extra_eos))

    def resources(self) -> dict:
        return {"device": self.device, "cores": self.cores, "threads": self.threads, "dtype": self.dtype,
                "thread_trial_tokens_per_s": self.thread_trial or None}

    def choose_threads(self, probes: list[list[int]], tokens: int = 16) -> int:
        """Every core or one, whichever runs the probes (whole greedy runs, best of two) faster: on a
        busy machine an OpenMP team waits for its slowest thread, and a slowed baseline flatters every speedup."""
        if self.device != "cpu" or len(self.cores) < 2:
            return self.threads
        speeds = {}
        for threads in (len(self.cores), 1):
            torch.set_num_threads(threads)
            seconds = sum(min(self.run("vanilla", ids, tokens).total_s for _ in range(2)) for ids in probes)
            speeds[threads] = tokens * len(probes) / seconds
        self.thread_trial = {str(k): round(v, 2) for k, v in speeds.items()}
        self.threads = max(speeds, key=speeds.get)
        torch.set_num_threads(self.threads)
        return self.threads

    @torch.inference_mode()
    def run(self, mode: str, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
            top_p: float = 1.0, seed: int = 0) -> BaselineRun:
        """One generation: mode "vanilla" or "pld"; greedy when temperature == 0."""
        kwargs = {"max_new_tokens": max_new_tokens, "eos_token_id": self.eos or None,
                  "pad_token_id": self.eos[0] if self.eos else 0}
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if mode == "pld":
            kwargs["prompt_lookup_num_tokens"] = PLD_NUM_TOKENS
        elif mode != "vanilla":
            raise ValueError(f"unknown baseline {mode!r}")
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        attention_mask = torch.ones_like(input_ids)
        torch.manual_seed(seed)
        clock, counter = _FirstTokenClock(), _PldCounter()
        with counter.counting() if mode == "pld" else contextlib.nullcontext():
            self._sync()
            start = time.perf_counter()
            out = self.model.generate(input_ids, attention_mask=attention_mask, streamer=clock, **kwargs)
            self._sync()
            total = time.perf_counter() - start
        new = out[0, len(prompt_ids):].tolist()
        ttft = (clock.first_token_at - start) if clock.first_token_at else total
        finish = "eos" if new and new[-1] in self.eos else "length"
        run = BaselineRun(new, total, ttft, finish, rounds=counter.rounds if mode == "pld" else len(new))
        if mode == "pld":
            run.drafted, run.accepted, run.gamma = counter.drafted, counter.accepted, PLD_NUM_TOKENS
            run.spec_rounds, run.committed_in_spec_rounds = counter.spec_rounds, counter.committed
        return run

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)
