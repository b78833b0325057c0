"""The whole suite in one process: one engine, the baselines beside it, every
method on every prompt, greedy and sampled, then the draft-alone ceiling.

Methods are interleaved per prompt (prompt 1: all methods, prompt 2: all
methods, ...) rather than run one after the other, so that a slow spell on a
shared machine hits every method alike instead of one method's whole run.
Every sampled run of a prompt uses the same seed, whatever the method.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
import zlib
from datetime import UTC, datetime
from pathlib import Path

from hetspec.benchmarks.bench.baselines import Baselines
from hetspec.benchmarks.bench.ceiling import measure_ceiling
from hetspec.benchmarks.bench.data import load_prompts
from hetspec.benchmarks.bench.engine_runs import EngineHolder, poor_draft_config, run_engine
from hetspec.benchmarks.bench.machine import describe_machine
from hetspec.benchmarks.bench.methods import CPP_PEER, PEER, Method, select_methods
from hetspec.benchmarks.bench.metrics import aggregate
from hetspec.benchmarks.bench.settings import DECODINGS, BenchSettings, engine_config, split_config
from hetspec.config import load_config
from hetspec.core.errors import EngineDeadError
from hetspec.ipc.specs import GGUF_TARGET_BACKENDS
from hetspec.models import resolve_model
from hetspec.scheduler.tokenizer import Tokenizer
from hetspec.workers.common.extras import require_llama_cpp

SCHEMA = "hetspec-bench/1"
WARMUP_TOKENS = 8


def run_suite(settings: BenchSettings, argv: list[str] | None = None) -> dict:
    """Run everything `settings` asks for and return the results document (results.json)."""
    settings.validate()
    config_dict, _ = split_config(settings.config)
    config_dict = engine_config(config_dict, settings.dtype)
    config = load_config(config_dict)
    methods = select_methods(settings.methods)
    requested = {m.name for m in methods}
    cpp_rows = [m for m in methods if m.kind == "cpp"]      # llama.cpp's binaries: results.json "llama_cpp"
    methods = [m for m in methods if m.kind != "cpp"]
    prompts = load_prompts(settings.categories, settings.limit, settings.max_new_tokens)
    tokenizer = Tokenizer(resolve_model(config.target.model, "target"))
    use_chat = _use_chat(settings.prompt_format, tokenizer)
    prompt_ids = {p.key: _encode(tokenizer, p.text, use_chat) for p in prompts}
    started = time.perf_counter()
    load_at_start = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    phases: dict[str, float] = {}
    clock = _Phases(phases)
    runs: list[dict] = []
    _quiet_transformers()

    cpp_note = f" (+ {len(cpp_rows)} of llama.cpp's binaries, once a prompt)" if cpp_rows else ""
    _log(settings, f"hetspec-bench: {len(prompts)} prompts x {len(methods)} methods{cpp_note} x "
                   f"{len(settings.decodings)} decodings; starting the engine ({config.target.model}, "
                   f"{config.target.backend if config.target.backend != 'transformers' else config.target.dtype})")
    clock.start("engine_start")            # load both models, measure the budget
    holder = EngineHolder(config_dict)
    poor = cpp = None
    try:
        clock.stop("engine_start")
        info = holder.info
        if any(m.kind == "poor" for m in methods):
            with clock("poor_engine_start"):
                poor = EngineHolder(poor_draft_config(config_dict, int(info["n_vocab"])))
        chosen, max_gamma = int(info["gamma"]), config.decoding.max_gamma
        measured = (info.get("budget") or {}).get("source") == "measured"
        baselines = None
        if any(m.kind == "baseline" for m in methods):
            with clock("baselines_load"):
                baselines = Baselines(config.target.model, config.target.dtype, info["target"]["device"],
                                      extra_eos=tokenizer.eos_token_ids, threads=settings.baseline_threads or None)
                if not settings.baseline_threads:
                    first, longest = prompt_ids[prompts[0].key], max(prompt_ids.values(), key=len)
                    baselines.choose_threads([first] if longest is first else [first, longest])
        llama_cpp: dict = {}
        if cpp_rows:
            with clock("llama_cpp_load"):
                cpp, llama_cpp = _cpp_peer(settings, config, tokenizer, cpp_rows, info)
            if cpp is None:
                cpp_rows = []
                names = [m.name for m in methods]
                if CPP_PEER in requested and PEER not in names:
                    methods = select_methods([*names, PEER])     # the llama-cpp-python row in its place
        peer = None
        if any(m.kind == "peer" for m in methods):
            with clock("peer_load"):
                peer = _peer(config, tokenizer)
        resources = _resources(methods, info, baselines, peer, config.target.dtype)
        if settings.warmup:
            with clock("warmup"):
                _warm_up(holder.engine, (baselines, peer), [m for m in methods if m.kind != "poor"], chosen,
                         max_gamma, prompt_ids[prompts[0].key])
                if poor is not None:
                    _warm_up(poor.engine, (None, None), [m for m in methods if m.kind == "poor"], chosen, max_gamma,
                             prompt_ids[prompts[0].key])
        clock.start("runs")
        bar = _progress(settings, len(prompts) * (len(methods) * len(settings.decodings) + len(cpp_rows)))
        for decoding in settings.decodings:
            params = DECODINGS[decoding]
            for prompt in prompts:
                ids, seed = prompt_ids[prompt.key], zlib.crc32(prompt.key.encode())
                # llama.cpp's binaries decode each prompt once (greedy, or no sampling at all: llama-bench)
                for method in [*methods, *(cpp_rows if decoding == settings.decodings[0] else [])]:
                    bar.set_postfix_str(f"{decoding} {prompt.category} {method.name}", refresh=False)
                    if method.kind == "cpp":
                        llama_cpp["runs"].append(_run_cpp(cpp, method, prompt, ids, settings))
                        bar.update(1)
                        continue
                    record = {"method": method.name, "category": prompt.category, "question_id": prompt.question_id,
                              "decoding": decoding, "prompt_tokens": len(ids), "max_new_tokens": prompt.max_new_tokens,
                              "seed": seed if decoding != "greedy" else None}
                    engine = poor.engine if method.kind == "poor" else holder.engine
                    try:
                        record.update(_run_one(engine, (baselines, peer), method, chosen, max_gamma, ids,
                                               prompt.max_new_tokens, params, seed))
                    except Exception as exc:  # noqa: BLE001 - one failed run must not sink the suite
                        record["error"] = f"{type(exc).__name__}: {exc}"
                        _log(settings, f"\n{method.name} on {prompt.key} ({decoding}) failed: {record['error']}")
                        which = poor if method.kind == "poor" else holder
                        if isinstance(exc, EngineDeadError) and which.restart(record["error"]):
                            _log(settings, "restarted the engine")
                            if settings.warmup:
                                _warm_up(which.engine, (None, None), [m for m in methods if m.kind == method.kind], chosen,
                                         max_gamma, prompt_ids[prompts[0].key])
                    runs.append(record)
                    bar.update(1)
        bar.close()
        clock.stop("runs")
    finally:
        holder.close()
        if poor is not None:
            poor.close()
        if peer is not None:
            peer.close()
        if cpp is not None:
            cpp.close()
    with clock("ceiling"):
        ceiling = _ceiling(settings, config, prompts, prompt_ids, info)
    doc = {
        "schema": SCHEMA,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(argv) if argv is not None else " ".join(sys.argv),
        "duration_s": round(time.perf_counter() - started, 1),
        "phases_s": {k: round(v, 1) for k, v in phases.items()},
        "machine": {**describe_machine(), "load_average_start": load_at_start},
        "settings": {
            "config": settings.config or "smollm2 (embedded default)",
            "engine_config": info.get("config", config.to_dict()),
            "draft_model": config.draft.model, "target_model": config.target.model,
            "target_backend": info["target"]["backend"],   # "auto" resolved by the target worker
            "dtype": config.target.dtype, "limit": settings.limit, "categories": settings.categories,
            "methods": [m.name for m in methods], "decodings": {d: DECODINGS[d] for d in settings.decodings},
            "top_k": 0, "prompt_format": "chat" if use_chat else "plain",
            "max_new_tokens": {c: next(p.max_new_tokens for p in prompts if p.category == c)
                               for c in settings.categories},
        },
        "chosen_gamma": chosen,
        "engine": {"gamma": chosen, "budget": info.get("budget"), "draft": info.get("draft"),
                   "target": info.get("target"), "prompt_kv": info.get("prompt_kv"),
                   "vocabulary": info.get("vocabulary"),
                   "poor_draft": poor.config["draft"]["model"] if poor else None},
        "methods": {m.name: {"label": m.label, "kind": m.kind, "mode": m.mode, "sequences": m.sequences,
                             "gamma": m.gamma(chosen, max_gamma), "rebalanced": m.rebalanced(measured),
                             "speculation": m.speculation or "auto",
                             **resources[m.name]} for m in methods},
        "draft_ceiling": ceiling,
        "engine_restarts": holder.restarts + (poor.restarts if poor else []),
        "runs": runs,
    }
    doc["results"] = aggregate(doc)
    _add_ceiling_fraction(doc)
    if llama_cpp:
        from hetspec.benchmarks.bench.llama_bin import summarize, versus

        doc["llama_cpp"] = llama_cpp
        llama_cpp["results"] = summarize(llama_cpp["runs"], settings.categories)
        llama_cpp["vs"] = versus(doc)
    return doc


def _run_one(engine, in_process, method: Method, chosen: int, max_gamma: int, ids, max_new: int, params: dict,
             seed: int) -> dict:
    """in_process: (the transformers baselines, the llama.cpp peer), either None when not run."""
    baselines, peer = in_process
    if method.kind in ("baseline", "peer"):
        if method.kind == "peer":
            run = peer.run(method.mode, method.threads, ids, max_new, params["temperature"], params["top_p"], seed)
        else:
            run = baselines.run(method.mode, ids, max_new, params["temperature"], params["top_p"], seed)
        return {"token_ids": run.token_ids, "new_tokens": len(run.token_ids), "finish_reason": run.finish_reason,
                "total_s": run.total_s, "ttft_s": run.ttft_s, "rounds": run.rounds, "spec_rounds": run.spec_rounds,
                "drafted": run.drafted, "accepted": run.accepted,
                "committed_in_spec_rounds": run.committed_in_spec_rounds,
                "gamma": _pld_gamma(method, params)}
    return run_engine(engine, method, method.gamma(chosen, max_gamma), ids, max_new, params["temperature"],
                      params["top_p"], seed)


def _pld_gamma(method: Method, params: dict) -> int | None:
    """Prompt lookup's draft length (llama.cpp's looks up greedy runs only)."""
    if method.mode != "pld" or method.kind == "peer" and params["temperature"] > 0:
        return None
    if method.kind == "baseline":
        return 10
    from hetspec.benchmarks.bench.llama_peer import PLD_MAX

    return PLD_MAX


def _warm_up(engine, in_process, methods, chosen, max_gamma, ids) -> None:
    """First calls pay for allocations and lazy imports; keep that out of the timings."""
    ids = ids[:64]
    done = set()
    for method in methods:
        key = (method.kind, method.mode, method.threads)
        if key in done:
            continue
        done.add(key)
        for params in DECODINGS.values():
            try:
                _run_one(engine, in_process, method, chosen, max_gamma, ids, WARMUP_TOKENS, params, 0)
            except Exception:  # noqa: BLE001, S110 - the timed run of this method will fail and say why
                pass


def _peer(config, tokenizer):
    """llama.cpp on the target's own GGUF file (a target that is no GGUF file has no peer).
    Imported here: a run without peers (a GPU's) needs no llama.cpp."""
    require_llama_cpp("the benchmark's llama.cpp peer")
    from hetspec.benchmarks.bench.llama_peer import LlamaPeer

    model = resolve_model(config.target.model, "target")
    if not model.gguf_file:
        raise ValueError(f"the llama.cpp peer needs a GGUF target, got {config.target.model!r}: leave out the peers "
                         "(--methods) for this config")
    return LlamaPeer(model.file, config.server.max_context + 512, tokenizer.eos_token_ids)


def _cpp_peer(settings, config, tokenizer, rows: list[Method], info: dict):
    """llama.cpp's own binaries on the target's GGUF file (benchmarks/llama_bin.py), and the
    results.json section they fill; (None, {"missing": why}) when they are not built."""
    from hetspec.benchmarks.bench.llama_bin import LlamaBinaries, find_binaries, missing_line

    target = resolve_model(config.target.model, "target")
    if not target.gguf_file:
        raise ValueError(f"llama.cpp's rows need a GGUF target, got {config.target.model!r}: leave out the peers "
                         "(--methods) for this config")
    bin_dir = find_binaries()
    if bin_dir is None:
        _log(settings, missing_line(), always=True)
        return None, {"missing": missing_line(), "methods": {}, "runs": []}
    draft = resolve_model(config.draft.model, "draft")
    shared = (info.get("vocabulary") or {}).get("shared", True)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cpp = LlamaBinaries(bin_dir, target.file, draft.file if draft.gguf_file else None, cores,
                        _detokenizer(tokenizer), repack=_repacks(target.file))
    section = {"binaries": str(bin_dir), "build_info": cpp.build_info, "cores": cores, "methods": {}, "skipped": {},
               "runs": [], "load_ms": {}}
    for m in rows:
        why = cpp.skip_reason(m.mode, shared)
        if why:
            section["skipped"][m.name] = why
        else:
            section["methods"][m.name] = {"label": m.label, "kind": m.kind, "mode": m.mode,
                                          **cpp.resources(m.mode, m.threads)}
    for file in dict.fromkeys([target.file, *([cpp.draft] if "llama-spec" in section["methods"] else [])]):
        try:
            section["load_ms"][Path(file).name] = cpp.load_time(file)
        except (RuntimeError, ValueError, OSError) as exc:
            section["load_ms"][Path(file).name] = {"error": str(exc)}
    rows[:] = [m for m in rows if m.name in section["methods"]]
    return cpp, section


def _repacks(path: str) -> bool:
    """Whether llama.cpp's repacked weights run here (llama_handles probes a CPU with AMX)."""
    try:
        from hetspec.workers.common.llama_handles import repacked_weights_run
    except ImportError:            # no llama-cpp-python: no probe (and no AMX build of it to probe)
        return True
    return repacked_weights_run(path)


def _run_cpp(cpp, method: Method, prompt, ids: list[int], settings) -> dict:
    record = {"method": method.name, "category": prompt.category, "question_id": prompt.question_id,
              "prompt_tokens": len(ids), "max_new_tokens": prompt.max_new_tokens}
    try:
        record.update(cpp.run(method.mode, method.threads, ids, prompt.max_new_tokens))
    except Exception as exc:  # noqa: BLE001 - one failed run must not sink the suite
        record["error"] = f"{type(exc).__name__}: {exc}"
        _log(settings, f"\n{method.name} on {prompt.key} failed: {record['error']}")
    return record


def _detokenizer(tokenizer: Tokenizer):
    """Prompt ids -> the text llama.cpp tokenizes back to them (special tokens spelt out;
    without the start tokens, which llama.cpp adds itself)."""
    start = tokenizer.encode_start()

    def text(ids: list[int]) -> str:
        ids = ids[len(start):] if start and ids[:len(start)] == start else ids
        return tokenizer.decode(ids, skip_special_tokens=False)

    return text


def _resources(methods, info: dict, baselines, peer, dtype: str) -> dict:
    """Which cores and threads each method computed on (the report states them)."""
    draft, target = info["draft"], info["target"]
    engine_side = {"device": target["device"],
                   "dtype": "gguf" if target["backend"] in GGUF_TARGET_BACKENDS else dtype,
                   "draft_cores": draft["cores"], "draft_threads": draft["threads"],
                   "target_cores": target["cores"], "target_threads": target["threads"]}
    out = {}
    for m in methods:
        if m.kind == "baseline":
            out[m.name] = baselines.resources()
        elif m.kind == "peer":
            out[m.name] = peer.resources(m.threads)
        elif m.mode == "target":
            out[m.name] = {k: v for k, v in engine_side.items() if not k.startswith("draft")}
            if info.get("alone_borrows_draft_cores"):     # alone, it computes on the draft's cores too
                out[m.name].update(target_cores=sorted(target["cores"] + draft["cores"]),
                                   target_threads=target["threads"] + draft["threads"])
        else:
            out[m.name] = dict(engine_side)
    return out


def _ceiling(settings, config, prompts, prompt_ids, info) -> dict:
    if not settings.ceiling:
        return {"skipped": "disabled (--no-ceiling)"}
    if config.draft.backend not in ("native", "llama.cpp"):
        return {"skipped": f"the draft backend is {config.draft.backend!r}, not native or llama.cpp"}
    _log(settings, "measuring the draft model alone (greedy)...")
    encode = _draft_encoder(config, info)
    first = {}
    for p in prompts:               # one prompt per category is enough for a decoding speed
        first.setdefault(p.category, {"ids": encode(p.text, prompt_ids[p.key]), "max_new_tokens": p.max_new_tokens})
    model_file = resolve_model(config.draft.model, "draft").file
    return measure_ceiling(model_file, list(info["draft"]["cores"]), int(info["draft"]["threads"]),
                           list(first.values()), config.draft.weights, backend=config.draft.backend)


def _draft_encoder(config, info: dict):
    """The draft's own tokens of a prompt: the target's, unless the vocabularies differ."""
    if (info.get("vocabulary") or {}).get("shared", True):
        return lambda text, ids: ids
    draft = Tokenizer(resolve_model(config.draft.model, "draft"))
    return lambda text, ids: draft.encode_prompt(text)


def _add_ceiling_fraction(doc: dict) -> None:
    """DuoDecoding's decoding speed (after the first token) as a fraction of the draft alone."""
    ceiling = doc["draft_ceiling"]
    if not ceiling.get("tokens_per_s"):
        return
    fractions = {}
    for decoding, by_method in doc["results"].items():
        avg = by_method.get("duodec", {}).get("average", {})
        if avg.get("decode_tokens_per_s"):
            fractions[decoding] = avg["decode_tokens_per_s"] / ceiling["tokens_per_s"]
    ceiling["duodec_fraction"] = fractions


class _Phases:
    """Wall time of the suite's phases (engine start, warm-up, runs, ...), for the report."""

    def __init__(self, into: dict):
        self.into = into
        self.started: dict[str, float] = {}

    def start(self, name: str) -> None:
        self.started[name] = time.perf_counter()

    def stop(self, name: str) -> None:
        if name in self.started:
            self.into[name] = time.perf_counter() - self.started.pop(name)

    @contextlib.contextmanager
    def __call__(self, name: str):
        self.start(name)
        try:
            yield
        finally:
            self.stop(name)


def _quiet_transformers() -> None:
    """Our own progress bar is the one to watch: silence transformers' loading bars."""
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()


def _use_chat(prompt_format: str, tokenizer: Tokenizer) -> bool:
    if prompt_format == "auto":
        return bool(tokenizer.backend is not None and tokenizer.chat_template)
    return prompt_format == "chat"


def _encode(tokenizer: Tokenizer, text: str, chat: bool) -> list[int]:
    if chat:
        return tokenizer.encode_chat([{"role": "user", "content": text}])
    return tokenizer.encode_prompt(text)


def _progress(settings, total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="hetspec-bench", unit="run", disable=not settings.progress, dynamic_ncols=True)


def _log(settings, message: str, always: bool = False) -> None:
    if settings.progress or always:
        print(message, file=sys.stderr, flush=True)
