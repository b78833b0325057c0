"""The transformers baseline in the benchmark process: vanilla `generate`, every speedup's denominator.
It loads the target as the engine's target worker does, in its dtype, so methods differ in decoding
only; it may use every core while the engine idles."""
from __future__ import annotations

import contextlib
import io
import time

import torch

from hetspec.benchmarks.bench.machine import affinity
from hetspec.models import resolve_model
from hetspec.workers.common.hf_loading import eos_token_ids, load_causal_lm


class _Clock:
    """A generate() streamer: the first put() is the prompt, the second the first new token."""

    def __init__(self):
        self.puts: list[float] = []

    def put(self, value) -> None:
        self.puts.append(time.perf_counter())

    def end(self) -> None:
        pass


class Baselines:
    def __init__(self, model_spec: str, dtype: str, device: str, extra_eos: set[int] = frozenset(),
                 threads: int | None = None):
        """Load the target; `extra_eos`: the tokenizer's EOS, as the engine adds; threads None: every core."""
        self.device, self.dtype, self.cores = device, dtype, affinity()
        if device == "cpu":
            torch.set_num_threads(threads or len(self.cores))
        self.threads = torch.get_num_threads()
        with contextlib.redirect_stderr(io.StringIO()):   # the GGUF loader's own progress bar
            self.model = load_causal_lm(resolve_model(model_spec, "target"), dtype, device)
        self.eos = sorted(set(eos_token_ids(self.model)) | set(extra_eos))

    def resources(self) -> dict:
        return {"device": self.device, "cores": self.cores, "threads": self.threads, "dtype": self.dtype}

    @torch.inference_mode()
    def run(self, prompt_ids: list[int], max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
            seed: int = 0) -> dict:
        """One generation, greedy when temperature == 0: a results.json record's fields."""
        sampled = temperature > 0
        kwargs = {"max_new_tokens": max_new_tokens, "eos_token_id": self.eos or None,
                  "pad_token_id": self.eos[0] if self.eos else 0, "do_sample": sampled,
                  "temperature": temperature if sampled else None, "top_p": top_p if sampled else None,
                  "top_k": 0 if sampled else None}
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        torch.manual_seed(seed)
        clock = _Clock()
        self._sync()
        start = time.perf_counter()
        out = self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids), streamer=clock, **kwargs)
        self._sync()
        total_s = time.perf_counter() - start
        token_ids = out[0, len(prompt_ids):].tolist()
        return {"token_ids": token_ids, "new_tokens": len(token_ids), "total_s": total_s,
                "ttft_s": clock.puts[1] - start if len(clock.puts) > 1 else total_s,
                "finish_reason": "eos" if token_ids and token_ids[-1] in self.eos else "length"}

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize(self.device)
