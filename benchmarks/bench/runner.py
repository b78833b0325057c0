"""The whole suite in one process: one engine, the baselines beside it, every method on every
prompt. Methods take turns per prompt, so that a slow spell on a shared machine hits every method
alike; every sampled run of a prompt has the same seed."""
from __future__ import annotations

import contextlib
import os
import sys
import time
import zlib
from datetime import UTC, datetime

from tqdm import tqdm
from transformers.utils import logging

import hetspec
from hetspec.benchmarks.bench.baselines import Baselines
from hetspec.benchmarks.bench.data import load_prompts, tokenized
from hetspec.benchmarks.bench.llama_bin import open_binaries
from hetspec.benchmarks.bench.machine import affinity, describe_machine
from hetspec.benchmarks.bench.methods import Method, run_engine, select_methods
from hetspec.benchmarks.bench.metrics import complete
from hetspec.benchmarks.bench.settings import DECODINGS, engine_config, split_config
from hetspec.config import load_config
from hetspec.ipc.specs import GGUF_TARGET_BACKENDS
from hetspec.models import resolve_model
from hetspec.scheduler.tokenizer import Tokenizer
from hetspec.workers.common.hf_loading import resolve_dtype

SCHEMA = "hetspec-bench/1"
WARMUP_TOKENS = 8


def run_suite(settings, argv: list[str] | None = None) -> dict:
    """Run everything `settings` (hetspec-bench's arguments) asks for; the results document (results.json)."""
    suite = _Suite(settings)
    try:
        suite.start()
        suite.run_all()
    finally:
        for part in (suite.engine, suite.cpp):
            if part is not None:
                part.close()
    return complete(suite.document(argv))


class _Suite:
    """One run: the engine and the baseline it measures, and the records it keeps."""

    def __init__(self, settings):
        self.settings = settings
        self.config_dict = engine_config(split_config(settings.config)[0], settings.dtype)
        self.config = load_config(self.config_dict)
        methods = select_methods(settings.methods)
        self.methods = [m for m in methods if m.kind != "cpp"]
        self.cpp_rows = [m for m in methods if m.kind == "cpp"]      # llama.cpp's binaries: results.json "llama_cpp"
        self.prompts = load_prompts(settings.categories, settings.limit, settings.max_new_tokens)
        self.tokenizer = Tokenizer(resolve_model(self.config.target.model, "target"))
        self.use_chat, self.prompt_ids = tokenized(self.prompts, self.tokenizer)
        self.started = time.perf_counter()
        self.load_at_start = [round(x, 2) for x in os.getloadavg()]
        self.runs: list[dict] = []
        self.llama_cpp: dict = {}
        self.engine = self.baselines = self.cpp = None
        logging.disable_progress_bar()          # our progress bar is the one to watch
        logging.set_verbosity_error()

    def start(self) -> None:
        s, target = self.settings, self.config.target
        cpp_note = f" (+ {len(self.cpp_rows)} of llama.cpp's binaries, once a prompt)" if self.cpp_rows else ""
        _log(s, f"hetspec-bench: {len(self.prompts)} prompts x {len(self.methods)} methods{cpp_note} x "
                f"{len(s.decodings)} decodings; starting the engine ({target.model}, "
                f"{target.backend if target.backend != 'transformers' else target.dtype})")
        self.engine = hetspec.launch(self.config_dict)      # load both models, measure the budget
        self.info = self.engine.info
        self.dtype = resolve_dtype(target.dtype, resolve_model(target.model, "target"), self.info["target"]["device"])
        self.chosen = int(self.info["gamma"])
        if any(m.kind == "baseline" for m in self.methods):
            self.baselines = Baselines(target.model, self.dtype, self.info["target"]["device"],
                                       extra_eos=self.tokenizer.eos_token_ids, threads=s.baseline_threads or None)
        if self.cpp_rows:
            self._open_binaries()
        self._warm_up(self.methods)

    def _open_binaries(self) -> None:
        """llama.cpp's own binaries on the target's GGUF file; where they are not built, one line says how."""
        target = resolve_model(self.config.target.model, "target")
        if not target.gguf_file:
            raise ValueError(f"llama.cpp's rows need a GGUF target, got {self.config.target.model!r}: leave out "
                             "the peers (--methods) for this config")
        draft = resolve_model(self.config.draft.model, "draft")
        shared = (self.info.get("vocabulary") or {}).get("shared", True)
        self.cpp, self.llama_cpp = open_binaries(self.cpp_rows, target.file, draft.file if draft.gguf_file else None,
                                                 self.tokenizer, shared, affinity())
        if self.cpp is None:
            _log(self.settings, self.llama_cpp["missing"], always=True)
            self.cpp_rows = []

    def _warm_up(self, methods: list[Method]) -> None:
        """First calls pay for allocations and lazy imports; keep that out of the timings."""
        ids = self.prompt_ids[self.prompts[0].key][:64]
        first_of_a_kind = {(m.kind, m.mode): m for m in reversed(methods)}
        for method in first_of_a_kind.values():
            for params in DECODINGS.values():
                with contextlib.suppress(Exception):    # the timed run of this method will fail and say why
                    self._generate(method, ids, WARMUP_TOKENS, params, 0)

    def run_all(self) -> None:
        s = self.settings
        bar = tqdm(total=len(self.prompts) * (len(self.methods) * len(s.decodings) + len(self.cpp_rows)),
                   desc="hetspec-bench", unit="run", disable=not s.progress, dynamic_ncols=True)
        for decoding in s.decodings:
            # llama.cpp's binaries decode each prompt once (greedy, or no sampling at all: llama-bench)
            cpp = self.cpp_rows if decoding == s.decodings[0] else []
            for prompt in self.prompts:
                for method in [*self.methods, *cpp]:
                    bar.set_postfix_str(f"{decoding} {prompt.category} {method.name}", refresh=False)
                    if method.kind == "cpp":
                        self.llama_cpp["runs"].append(self._run(method, prompt, None))
                    else:
                        self.runs.append(self._run(method, prompt, decoding))
                    bar.update(1)
        bar.close()

    def _run(self, method: Method, prompt, decoding: str | None) -> dict:
        """One run's record; a failed run keeps its error."""
        ids, seed = self.prompt_ids[prompt.key], zlib.crc32(prompt.key.encode())
        record = {"method": method.name, "category": prompt.category, "question_id": prompt.question_id,
                  "prompt_tokens": len(ids), "max_new_tokens": prompt.max_new_tokens}
        if decoding is not None:
            record.update(decoding=decoding, seed=seed if decoding != "greedy" else None)
        try:
            record.update(self.cpp.run(method.mode, method.threads, ids, prompt.max_new_tokens) if decoding is None
                          else self._generate(method, ids, prompt.max_new_tokens, DECODINGS[decoding], seed))
        except Exception as exc:  # noqa: BLE001 - one failed run must not sink the suite
            record["error"] = f"{type(exc).__name__}: {exc}"
            _log(self.settings, f"\n{method.name} on {prompt.key} ({decoding or 'once'}) failed: {record['error']}")
        return record

    def _generate(self, method: Method, ids: list[int], max_new: int, params: dict, seed: int) -> dict:
        temperature, top_p = params["temperature"], params["top_p"]
        if method.kind == "baseline":
            return self.baselines.run(ids, max_new, temperature, top_p, seed)
        return run_engine(self.engine, method, method.gamma(self.chosen), ids, max_new, temperature, top_p, seed)

    def document(self, argv: list[str] | None) -> dict:
        """The results document (results.json) before its figures (metrics.complete)."""
        info, chosen, s = self.info, self.chosen, self.settings
        measured = (info.get("budget") or {}).get("source") == "measured"
        doc = {
            "schema": SCHEMA, "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": " ".join(sys.argv if argv is None else argv),
            "duration_s": round(time.perf_counter() - self.started, 1),
            "machine": {**describe_machine(), "load_average_start": self.load_at_start},
            "settings": {"config": s.config or "smollm2 (embedded default)",
                         "engine_config": info.get("config", self.config.to_dict()),
                         "draft_model": self.config.draft.model, "target_model": self.config.target.model,
                         "target_backend": info["target"]["backend"],   # "auto" resolved by the target worker
                         "dtype": self.dtype, "limit": s.limit, "categories": s.categories,
                         "methods": [m.name for m in self.methods], "decodings": {d: DECODINGS[d] for d in s.decodings},
                         "top_k": 0, "prompt_format": "chat" if self.use_chat else "plain",
                         "max_new_tokens": {p.category: p.max_new_tokens for p in self.prompts}},
            "chosen_gamma": chosen,
            "engine": {**{k: info.get(k) for k in ("budget", "draft", "target", "prompt_kv", "vocabulary")},
                       "gamma": chosen},
            "methods": {m.name: {"label": m.label, "kind": m.kind, "mode": m.mode, "sequences": m.sequences,
                                 "gamma": m.gamma(chosen), "rebalanced": m.rebalanced(measured),
                                 "speculation": m.speculation or "auto", **self._resources(m)}
                        for m in self.methods},
            "runs": self.runs, "results": {},
        }
        if self.llama_cpp:
            doc["llama_cpp"] = self.llama_cpp
        return doc

    def _resources(self, m: Method) -> dict:
        """Which cores and threads a method computed on (the report states them)."""
        if m.kind == "baseline":
            return self.baselines.resources()
        draft, target = self.info["draft"], self.info["target"]
        out = {"device": target["device"], "dtype": "gguf" if target["backend"] in GGUF_TARGET_BACKENDS else self.dtype,
               "target_cores": target["cores"], "target_threads": target["threads"]}
        if m.mode != "target":
            out.update(draft_cores=draft["cores"], draft_threads=draft["threads"])
        elif self.info.get("alone_borrows_draft_cores"):     # alone, it computes on the draft's cores too
            out.update(target_cores=sorted(target["cores"] + draft["cores"]),
                       target_threads=target["threads"] + draft["threads"])
        return out


def _log(settings, message: str, always: bool = False) -> None:
    if settings.progress or always:
        print(message, file=sys.stderr, flush=True)
