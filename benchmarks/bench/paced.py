"""hetspec-bench --paced PROFILE: the engine's modes against a paced target (simulated GPU,
workers/target/paced.py), greedy, on the suite's prompts. First, untimed, the config's own target
records the greedy traces the paced target lacks; then one engine, its target paced by the profile,
runs every method on each prompt in turn, and each output must equal its trace. Rates are decode
after the first token, pooled over the prompts."""
from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

import hetspec
from hetspec.benchmarks.bench.data import load_prompts, tokenized
from hetspec.benchmarks.bench.machine import describe_machine
from hetspec.benchmarks.bench.methods import METHODS, Method, run_engine
from hetspec.benchmarks.bench.settings import engine_config, split_config
from hetspec.benchmarks.bench.tables import table, times, write_outputs
from hetspec.config import load_config
from hetspec.core.gpu_profiles import profile as named_profile
from hetspec.models import resolve_model
from hetspec.scheduler.tokenizer import Tokenizer
from hetspec.workers.target.traces import add_trace, load_traces, trace_file

DEFAULT_METHODS = ("target", "lookup", "sps", "duodec")
PIECES = ("draft_s", "verify_s", "round_s", "overhead_s")


def paced_config(config: dict, profile: str, traces: str = "") -> dict:
    """The config with its target paced by `profile` (its model stays: tokenizer, vocabulary, traces)."""
    named_profile(profile)
    target = {**config.get("target", {}), "backend": "paced", "profile": profile, "traces": traces}
    for key in ("cores", "threads", "device"):     # the paced target's cores are the engine's choice
        target.pop(key, None)
    draft = {k: v for k, v in config.get("draft", {}).items() if k not in ("cores", "threads")}
    return {**config, "target": target, "draft": draft}


def _trace_file(config: dict, traces: str) -> Path:
    """The config's target's trace file, in the folder its paced form would read."""
    target = load_config(paced_config(config, "gpu-40ms", traces)).target
    return trace_file(resolve_model(target.model, "target").file, target.traces)


def record_missing(config: dict, prompts: dict[str, list[int]], max_new: dict[str, int], traces: str = "", log=print) -> int:
    """Record, with the config's own target alone (greedy), the traces of the prompts that have none of at least
    their max_new tokens; returns how many it recorded."""
    path = _trace_file(config, traces)
    have = {tuple(t.prompt.tolist()): t for t in load_traces(path)}
    missing = [key for key, ids in prompts.items() if tuple(ids) not in have or not have[tuple(ids)].covers(max_new[key])]
    if missing:
        log(f"recording {len(missing)} greedy trace(s) with the config's own target into {path} (untimed)")
        with hetspec.launch(config) as engine:
            for key in missing:
                result = engine.generate(list(prompts[key]), max_new_tokens=max_new[key], mode="target", temperature=0.0)
                add_trace(path, prompts[key], result.token_ids, max_new[key])
                log(f"  {key}: {len(result.token_ids)} tokens")
    return len(missing)


def run_paced(config: dict, profile: str, prompts: dict[str, list[int]], max_new: dict[str, int],
              methods: list[Method], traces: str = "", log=print) -> dict:
    """Every method on every prompt (in turn), on one engine paced by `profile`; the records, each checked against
    its trace."""
    record_missing(config, prompts, max_new, traces, log)
    recorded = {tuple(t.prompt.tolist()): t.full[len(t.prompt):].tolist() for t in load_traces(_trace_file(config, traces))}
    runs, started = [], time.perf_counter()
    with hetspec.launch(paced_config(config, profile, traces)) as engine:
        info = engine.get_info()
        for method in methods:          # warm: the first request of each mode pays for lazy work
            run_engine(engine, method, None, next(iter(prompts.values())), 8, 0.0, 1.0, 0)
        for key, ids in prompts.items():
            for method in methods:
                record = run_engine(engine, method, None, ids, max_new[key], 0.0, 1.0, 0)
                record.update(method=method.name, prompt=key,
                              matches_trace=record["token_ids"] == recorded[tuple(ids)][:len(record["token_ids"])])
                runs.append(record)
                seconds = record["total_s"] - record["ttft_s"]
                log(f"{key:18} {method.name:10} {(record['new_tokens'] - 1) / seconds if seconds > 0 else 0:7.2f} "
                    f"tok/s{'' if record['matches_trace'] else '  OUTPUT DIFFERS FROM THE TRACE'}")
    return {"profile": profile, "engine": {k: info.get(k) for k in ("gamma", "budget", "draft", "target",
                                                                       "keep_drafting")},
            "duration_s": round(time.perf_counter() - started, 1), "runs": runs}


def summarize(doc: dict, methods: list[Method]) -> dict:
    """Per method: pooled decode tok/s after the first token, its ratio to the target alone and to SpS (a forced
    method's to forced SpS, sps-fixed), and a speculative round's average pieces (ms)."""
    pooled = {m.name: Counter() for m in methods}
    for r in doc["runs"]:
        pooled[r["method"]].update(
            tokens=r["new_tokens"] - 1, seconds=r["total_s"] - r["ttft_s"], runs=1, differ=not r["matches_trace"],
            **{k: r[k] for k in ("spec_rounds", "drafted", "accepted", *PIECES)})
    rates = {name: c["tokens"] / c["seconds"] if c["seconds"] else 0.0 for name, c in pooled.items()}
    ratio = lambda a, b: round(a / b, 3) if b else None
    return {name: {"tokens_per_s": round(rates[name], 2), "vs_target": ratio(rates[name], rates.get("target")),
                   "vs_sps": ratio(rates[name], rates.get("sps-fixed" if METHODS[name].speculation else "sps")),
                   "runs": c["runs"], "outputs_differing_from_trace": c["differ"], "spec_rounds": c["spec_rounds"],
                   "acceptance": round(c["accepted"] / c["drafted"], 3) if c["drafted"] else None,
                   "ms_per_spec_round": {k[:-2]: round(1000 * c[k] / max(c["spec_rounds"], 1), 2) for k in PIECES}}
            for name, c in pooled.items()}


def render(doc: dict) -> str:
    p, machine, draft = named_profile(doc["profile"]), doc["machine"], doc["engine"]["draft"]
    rows = [[METHODS[name].label, f"{s['tokens_per_s']:.2f}", times(s["vs_target"]), times(s["vs_sps"]),
             "-" if s["acceptance"] is None else str(s["acceptance"]),
             " / ".join(map(str, s["ms_per_spec_round"].values())),
             f"{s['runs'] - s['outputs_differing_from_trace']}/{s['runs']}"] for name, s in doc["summary"].items()]
    lines = [f"# Paced target (simulated GPU), profile {p.name}", "", f"Command: `{doc['command']}`.", "",
             (f"Machine: {machine['cpu']}, {machine['logical_cores']} cores, load average at the end "
              f"{machine['load_average']}; commit {machine['git_commit']}."), "",
             f"Profile: {p.window_ms:g} ms a pass of up to {p.flat_to} tokens ({p.source}).", "",
             (f"Draft: {draft['kernels']}; cores {draft['cores']}, {draft['threads']} thread(s). Start-up gamma "
              f"{doc['engine']['gamma']}. Greedy, {len({r['prompt'] for r in doc['runs']})} prompts; decode after the "
              "first token, pooled."), "",
             *table(["method", "tok/s", "vs target alone", "vs SpS (forced: vs forced SpS)", "acceptance",
                     "ms a spec round: draft / verify / round / overhead", "outputs = trace"], rows)]
    return "\n".join(lines) + "\n"


def main(args, argv: list[str]) -> int:
    """hetspec-bench's `args` (--paced PROFILE) on the suite's prompts: run, check, write OUT/results.json and
    OUT/report.md; 1 where an output left its trace."""
    names = list(DEFAULT_METHODS) if args.methods == ["all"] else args.methods
    methods = [METHODS[n] for n in names if n in METHODS and METHODS[n].kind == "engine"]
    if not methods or len(methods) != len(names):
        raise ValueError(f"--paced runs engine methods only ({', '.join(DEFAULT_METHODS)}, ...), got {', '.join(names)}")
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.progress else (lambda m: None)
    config = engine_config(split_config(args.config)[0], args.dtype)
    prompts = load_prompts(args.categories, args.limit, args.max_new_tokens)
    ids = tokenized(prompts, Tokenizer(resolve_model(load_config(config).target.model, "target")))[1]
    doc = run_paced(config, args.paced, ids, {p.key: p.max_new_tokens for p in prompts}, methods, args.traces, log)
    doc.update(command=" ".join(["hetspec-bench", *argv]), machine=describe_machine())
    doc["summary"] = summarize(doc, methods)
    print(f"wrote {write_outputs(args.out, doc, render(doc))}", file=sys.stderr)
    for name, s in doc["summary"].items():
        print(f"{name}: {s['tokens_per_s']:.2f} tok/s, {times(s['vs_target'])} target, {times(s['vs_sps'])} SpS",
              file=sys.stderr)
    return 1 if any(s["outputs_differing_from_trace"] for s in doc["summary"].values()) else 0
