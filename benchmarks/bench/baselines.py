"""The transformers baselines in the benchmark process: vanilla `generate` (every speedup's
denominator) and prompt lookup (PLD). They load the target as the engine's target worker does,
in its dtype, so methods differ in decoding only; they may use every core while the engine idles.
"""
from __future__ import annotations

import contextlib
import io
import time
from dataclasses import asdict, dataclass

import torch

from hetspec.benchmarks.bench.machine import affinity
from hetspec.models import resolve_model
from hetspec.workers.common.hf_loading import eos_token_ids, load_causal_lm

PLD_NUM_TOKENS = 10    # transformers' documented default for prompt lookup


@dataclass
class BaselineRun:
    """One in-process generation."""
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
        return {**asdict(self), "new_tokens": len(self.token_ids)}


class _Clock:
    """A generate() streamer: the first put() is the prompt, the second the first new token."""

    def __init__(self):
        self.calls, self.first_token_at = 0, None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2:
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        pass


@contextlib.contextmanager
def _pld_counted(run: BaselineRun):
    """PLD's proposals and matches counted into `run`, by wrapping PromptLookupCandidateGenerator's
    get_candidates and update_candidate_strategy (class attributes, restored after)."""
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator as G

    get, update = G.get_candidates, G.update_candidate_strategy
    last = [0]

    def get_candidates(self, input_ids, *args, **kwargs):
        ids, logits = get(self, input_ids, *args, **kwargs)
        last[0], run.rounds = ids.shape[1] - input_ids.shape[1], run.rounds + 1
        return ids, logits

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        if last[0] > 0:
            run.spec_rounds, run.drafted = run.spec_rounds + 1, run.drafted + last[0]
            run.accepted += int(num_matches)
            run.committed_in_spec_rounds += int(num_matches) + 1
        return update(self, input_ids, scores, num_matches)

    G.get_candidates, G.update_candidate_strategy = get_candidates, update_candidate_strategy
    try:
        yield
    finally:
        G.get_candidates, G.update_candidate_strategy = get, update


class Baselines:
    def __init__(self, model_spec: str, dtype: str, device: str, extra_eos: set[int] = frozenset(),
                 threads: int | None = None):
        """Load the target; `extra_eos`: the tokenizer's EOS, as the engine adds; threads None: choose_threads() may."""
        self.device, self.dtype, self.cores = device, dtype, affinity()
        self.thread_trial: dict[str, float] = {}
        if device == "cpu":
            torch.set_num_threads(threads or len(self.cores))
        self.threads = torch.get_num_threads()
        with contextlib.redirect_stderr(io.StringIO()):   # the GGUF loader's own progress bar
            self.model = load_causal_lm(resolve_model(model_spec, "target"), dtype, device)
        self.eos = sorted(set(eos_token_ids(self.model)) | set(extra_eos))

    def resources(self) -> dict:
        return {"device": self.device, "cores": self.cores, "threads": self.threads, "dtype": self.dtype,
                "thread_trial_tokens_per_s": self.thread_trial or None}

    def choose_threads(self, probes: list[list[int]], tokens: int = 16) -> int:
        """Every core or one, whichever runs the probes (whole greedy runs, best of two) faster: on a busy
        machine an OpenMP team waits for its slowest thread, and a slowed baseline flatters every speedup."""
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
        if mode not in ("vanilla", "pld"):
            raise ValueError(f"unknown baseline {mode!r}")
        sampled = temperature > 0
        kwargs = {"max_new_tokens": max_new_tokens, "eos_token_id": self.eos or None,
                  "pad_token_id": self.eos[0] if self.eos else 0, "do_sample": sampled,
                  "temperature": temperature if sampled else None, "top_p": top_p if sampled else None,
                  "top_k": 0 if sampled else None}
        if mode == "pld":
            kwargs["prompt_lookup_num_tokens"] = PLD_NUM_TOKENS
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        torch.manual_seed(seed)
        clock, run = _Clock(), BaselineRun([], 0.0, 0.0, "length", gamma=PLD_NUM_TOKENS if mode == "pld" else None)
        with _pld_counted(run) if mode == "pld" else contextlib.nullcontext():
            self._sync()
            start = time.perf_counter()
            out = self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), streamer=clock, **kwargs)
            self._sync()
            run.total_s = time.perf_counter() - start
        run.token_ids = out[0, len(prompt_ids):].tolist()
        run.ttft_s = (clock.first_token_at - start) if clock.first_token_at else run.total_s
        run.finish_reason = "eos" if run.token_ids and run.token_ids[-1] in self.eos else "length"
        run.rounds = run.rounds if mode == "pld" else len(run.token_ids)
        return run

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)
