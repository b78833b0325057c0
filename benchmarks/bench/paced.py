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


LOOKUP_COUNTS = ("lookup_guessed", "lookup_accepted", "round_lookup_guessed", "round_lookup_accepted")


def summarize(doc: dict, methods: list[Method]) -> dict:
    """Per method: pooled decode tok/s after the first token (and per category), its ratio to the target alone and to
    SpS (a forced method's to forced SpS, sps-fixed), each proposer's acceptance, a speculative round's average pieces
    (ms) and each side's idle time in it, and the rounds' draft sequences."""
    pooled = {m.name: Counter() for m in methods}
    for r in doc["runs"]:
        category = r["prompt"].split("/")[0]
        pooled[r["method"]].update(
            tokens=r["new_tokens"] - 1, seconds=r["total_s"] - r["ttft_s"], runs=1, differ=not r["matches_trace"],
            **{f"{category}/tokens": r["new_tokens"] - 1, f"{category}/seconds": r["total_s"] - r["ttft_s"]},
            **{k: r.get(k, 0) for k in ("spec_rounds", "drafted", "accepted", *LOOKUP_COUNTS, *PIECES)},
            **{f"k={k}": n for k, n in (r.get("sequences_hist") or {}).items()})
    rates = {name: c["tokens"] / c["seconds"] if c["seconds"] else 0.0 for name, c in pooled.items()}
    return {name: {"tokens_per_s": round(rates[name], 2), "vs_target": _ratio(rates[name], rates.get("target")),
                   "vs_sps": _ratio(rates[name], rates.get("sps-fixed" if METHODS[name].speculation else "sps")),
                   **_figures(c)} for name, c in pooled.items()}


def _ratio(a: float, b: float | None) -> float | None:
    return round(a / b, 3) if b else None


def _figures(c: Counter) -> dict:
    """One method's pooled counts as its figures (summarize)."""
    rounds, lookup_accepted = max(c["spec_rounds"], 1), c["lookup_accepted"] + c["round_lookup_accepted"]
    return {"tokens_per_s_by_category": {k[:-8]: round(c[k[:-8] + "/tokens"] / c[k], 2)
                                         for k in sorted(c) if k.endswith("/seconds") and c[k]},
            "runs": c["runs"], "outputs_differing_from_trace": c["differ"], "spec_rounds": c["spec_rounds"],
            "acceptance": _ratio(c["accepted"], c["drafted"]),
            "lookup_acceptance": _ratio(lookup_accepted, c["lookup_guessed"] + c["round_lookup_guessed"]),
            "from_lookup": _ratio(lookup_accepted, c["tokens"]),
            "ms_per_spec_round": {k[:-2]: round(1000 * c[k] / rounds, 2) for k in PIECES},
            "idle_ms_per_spec_round": {side: round(1000 * (c["round_s"] - c[k]) / rounds, 2)
                                       for side, k in (("draft", "draft_s"), ("target", "verify_s"))},
            "sequences_hist": {k[2:]: c[k] for k in sorted(c) if k.startswith("k=")}}


def render(doc: dict) -> str:
    p, machine, draft = named_profile(doc["profile"]), doc["machine"], doc["engine"]["draft"]
    show = lambda value: "-" if value is None else str(value)
    rows = [[METHODS[name].label, f"{s['tokens_per_s']:.2f}", times(s["vs_target"]), times(s["vs_sps"]),
             " / ".join(f"{v:.2f}" for v in s.get("tokens_per_s_by_category", {}).values()),
             show(s["acceptance"]), show(s.get("lookup_acceptance")),
             " / ".join(map(str, s["ms_per_spec_round"].values())),
             " / ".join(map(str, s.get("idle_ms_per_spec_round", {}).values())),
             f"{s['runs'] - s['outputs_differing_from_trace']}/{s['runs']}"] for name, s in doc["summary"].items()]
    categories = next((list(s["tokens_per_s_by_category"]) for s in doc["summary"].values()
                       if s.get("tokens_per_s_by_category")), [])
    lines = [f"# Paced target (simulated GPU), profile {p.name}", "", f"Command: `{doc['command']}`.", "",
             (f"Machine: {machine['cpu']}, {machine['logical_cores']} cores, load average at the end "
              f"{machine['load_average']}; commit {machine['git_commit']}."), "",
             f"Profile: {p.window_ms:g} ms a pass of up to {p.flat_to} tokens ({p.source}).", "",
             (f"Draft: {draft['kernels']}; cores {draft['cores']}, {draft['threads']} thread(s). Start-up gamma "
              f"{doc['engine']['gamma']}. Greedy, {len({r['prompt'] for r in doc['runs']})} prompts; decode after the "
              "first token, pooled. Acceptance: the draft's accepted / drafted tokens; lookup: prompt lookup's, in "
              "target-only steps and after a round's window. Idle: a round's wall time less that side's work."), "",
             *table(["method", "tok/s", "vs target alone", "vs SpS (forced: vs forced SpS)",
                     f"tok/s {' / '.join(categories)}", "acceptance", "lookup acceptance",
                     "ms a spec round: draft / verify / round / overhead", "idle ms: draft / target",
                     "outputs = trace"], rows)]
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
