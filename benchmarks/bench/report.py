"""report.md from a results document, in the shape of the paper's Tables 1-3.

Everything here reads results.json only, so a report can be rebuilt (or
restyled) without re-running anything:

    python -m hetspec.benchmarks.bench.report bench-out/quick/results.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from hetspec.benchmarks.bench import tables
from hetspec.benchmarks.bench.checks import check_results
from hetspec.benchmarks.bench.data import TITLES
from hetspec.benchmarks.bench.metrics import complete, greedy_reference
from hetspec.benchmarks.bench.tables import pct, table
from hetspec.ipc.specs import GGUF_TARGET_BACKENDS


def render_report(doc: dict, plots: list[str] = ()) -> str:
    lines = ["# hetspec benchmark report", "", *_header(doc), *_methods_table(doc)]
    for decoding in doc["settings"]["decodings"]:
        lines += tables.table1(doc, decoding)
    for section in (tables.tokens_table, tables.llama_cpp_table, tables.table2, tables.acceptance_table,
                    tables.table3, tables.sequences_table, tables.poor_draft_table, tables.profile_table, _ceiling,
                    _exactness, _checks):
        lines += section(doc)
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    return "\n".join(lines + _definitions(doc))


def write_report(doc: dict, out_dir: str | Path, plots: list[str] = ()) -> Path:
    path = Path(out_dir) / "report.md"
    path.write_text(render_report(doc, plots))
    return path


# ---- sections ------------------------------------------------------------------

def _header(doc: dict) -> list[str]:
    s, m, e = doc["settings"], doc["machine"], doc["engine"]
    budget = e.get("budget") or {}
    cpu = (f"{m['cpu']}, {m['logical_cores']} logical cores (affinity {m['affinity']}), {m['memory_gb']} GB, "
           f"{m.get('isa', 'instruction set not recorded')}")
    lines = [
        f"Run {doc['created']} in {doc['duration_s']:.0f} s: `{doc['command']}`",
        "",
        (f"- **Machine**: {cpu}{'; GPU ' + m['gpu'] if m.get('gpu') else '; no GPU'}; load average (1, 5, 15 min) "
         f"{m.get('load_average_start')} at the start, {m.get('load_average')} at the end; git {m.get('git_commit')}"),
        "- **Phases** (s): " + ", ".join(f"{k.replace('_', ' ')} {v:.0f}" for k, v in doc.get("phases_s", {}).items()),
        "- **Software**: " + ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v),
        (f"- **Models**: draft `{s['draft_model']}`, target `{s['target_model']}`; " + _target_numbers(s)
         + f"; engine config {s['config']}" + _kernels(e)),
        f"- **Draft budget**: gamma = **{doc['chosen_gamma']}** ({budget.get('source', '?')})" + _budget_detail(budget),
        f"- **Prompts**: {_prompt_count(doc)} ({'all' if not s['limit'] else s['limit']} per category, "
        f"first turn, {s['prompt_format']} format); new tokens per category: "
        + ", ".join(f"{TITLES[c]} {n}" for c, n in s["max_new_tokens"].items()),
        "- **Decoding**: " + "; ".join(f"{d} (temperature {p['temperature']}, top_p {p['top_p']}, top_k 0)"
                                        for d, p in s["decodings"].items()),
        "",
    ]
    return lines


def _target_numbers(settings: dict) -> str:
    if settings.get("target_backend") in GGUF_TARGET_BACKENDS:
        runner = "hetspec's kernels" if settings["target_backend"] == "native" else "llama.cpp"
        return (f"the engine's target computes the GGUF file's own blocks through {runner}, as the llama.cpp rows "
                f"compute that file; vanilla and PLD run it in **{settings['dtype']}**")
    return f"target dtype **{settings['dtype']}** for the engine and every baseline"


def _kernels(engine: dict) -> str:
    """How the engine's workers run their models (older results lack the field)."""
    parts = [f"{role} runs {(engine.get(role) or {}).get('kernels')}" for role in ("draft", "target")
             if (engine.get(role) or {}).get("kernels")]
    if parts and engine.get("prompt_kv") == "target":
        parts[0] += ", takes the target's cache of a prompt (prompt_kv)"
    return "; engine " + ", ".join(parts) + " (baselines: transformers' defaults)" if parts else ""


def _budget_detail(budget: dict) -> str:
    if budget.get("source") != "measured":
        return ""
    verify = ", ".join(f"{n}: {1000 * t:.0f}" for n, t in budget.get("verify_s", {}).items())
    prefill = budget.get("draft_prefill_s_per_token")
    prefill = f", {1000 * prefill:.1f} ms a prompt token" if prefill else ""
    return (f": draft {1000 * budget['draft_s_per_token']:.1f} ms/token{prefill}; verify ms by tokens {{{verify}}} at a "
            f"{budget.get('context')}-token context. `duodec` and the `duodec-s*` methods start at gamma and then draft "
            "each round for as long as the target verifies, from the rounds' own timings; SpS drafts each round the window "
            "of least expected time per token, from the same timings and the acceptance seen so far; the sweep (`gamma-2` "
            ".. `gamma+2`) fixes gamma. `sps` and `duodec` may rest from speculating where it does not pay, as a user's "
            "requests do; the ablations (`sps-fixed`, `duodec-s*`, the sweep) force speculation, so each measures its own "
            "configuration")


def _prompt_count(doc: dict) -> str:
    keys = {(r["category"], r["question_id"]) for r in doc["runs"]}
    return f"{len(keys)} prompts in {len(doc['settings']['categories'])} categories"


def _methods_table(doc: dict) -> list[str]:
    rows = []
    for name, m in doc["methods"].items():
        gamma = "-" if m.get("gamma") is None else f"{m['gamma']}, rebalanced" if m.get("rebalanced") else m["gamma"]
        seqs = "-" if m.get("sequences") is None else m["sequences"]
        rows.append([f"`{name}`", m["label"], str(gamma), str(seqs), m["dtype"], _resources(m)])
    section = doc.get("llama_cpp") or {}
    for name, m in section.get("methods", {}).items():
        lengths = f", draft `{Path(m['draft']).name}`" if m.get("draft") else ""
        where = (f"{m['device']}, cores {m['cores']} (taskset), {m['threads']} thread(s) (`{m['tool']}`{lengths}; "
                 f"{m['settings']})")
        rows.append([f"`{name}`", m["label"], "-", "-", m["dtype"], where])
    note = [f"{section['missing']}.", ""] if section.get("missing") else []
    return ["## Methods and resources", "",
            *table(["method", "what", "gamma", "sequences", "dtype", "cores and threads"], rows), "", *note]


def _resources(m: dict) -> str:
    """Where a method computed: the benchmark process's cores, or the engine's workers'."""
    if m["kind"] == "peer":
        return f"{m['device']}, cores {m['cores']}, {m['threads']} thread(s) (benchmark process; {m['settings']})"
    if m["kind"] == "baseline":
        trial = m.get("thread_trial_tokens_per_s")
        why = ("; chosen as the faster on short and long prompt probes, prefill included: "
               + ", ".join(f"{t} thread(s) {v:.1f} tok/s" for t, v in trial.items()) if trial else "")
        return f"{m['device']}, cores {m['cores']}, {m['threads']} thread(s) (benchmark process{why})"
    target = f"{m['device']}, cores {m['target_cores']}, {m['target_threads']} thread(s)"
    if "draft_cores" in m:
        return f"draft: cores {m['draft_cores']}, {m['draft_threads']} thread(s); target: {target}"
    return f"target: {target}"


def _ceiling(doc: dict) -> list[str]:
    c = doc.get("draft_ceiling") or {}
    lines = ["## The draft model alone (ceiling)", ""]
    if "tokens_per_s" not in c:
        reason = c.get("skipped") or c.get("error") or "not measured"
        return lines + [f"Not measured: {reason}.", ""]
    weights = f", weights {c['weights']} as in the engine" if c.get("weights", "as-is") != "as-is" else ""
    runner = "The native draft" if c.get("backend") == "native" else "llama.cpp"
    lines.append(f"{runner} greedy on the draft's cores {c['cores']} with {c['threads']} thread(s){weights}: "
                 f"**{c['tokens_per_s']:.1f} tok/s** ({c['ms_per_token']:.2f} ms/token after the prompt; prompt "
                 f"prefill {c['prefill_ms_per_token']:.2f} ms/token; {c['prompts']} prompts). DuoDecoding "
                 f"cannot decode faster than its draft drafts, however often the two agree.")
    for d, fraction in (c.get("duodec_fraction") or {}).items():
        avg = doc["results"][d]["duodec"]["average"]
        lines.append(f"- {d}: DuoDecoding decodes at {avg['decode_tokens_per_s']:.1f} tok/s after its first token "
                     f"(**{fraction:.0%} of the ceiling**; {avg['tokens_per_s']:.1f} tok/s including the prompt)")
    return lines + [""]


def _exactness(doc: dict) -> list[str]:
    if "greedy" not in doc["results"]:
        return []
    reference = greedy_reference(doc["settings"])
    rows = [[f"`{name}`", pct(cells["average"]["exact_match"])] for name, cells in doc["results"]["greedy"].items()
            if name != reference and cells.get("average", {}).get("exact_match") is not None]
    if not rows:
        return []
    if reference == "target":
        return ["## Greedy output identical to the target alone", "",
                ("Share of prompts whose greedy tokens equal the engine's `target` method's (the GGUF target "
                 "computes the GGUF file's blocks, and its verification is batch-invariant, so any speculative "
                 "method must give them exactly). llama.cpp's own rows use its default kernels, whose one-token "
                 "and batched logits differ: their share is how often they agree."),
                "", *table(["method", "identical"], rows), ""]
    return ["## Greedy output identical to vanilla", "",
            ("Share of prompts whose greedy tokens equal transformers `generate`'s. Below 100% can be a float "
             "near-tie (batched verification, another thread count) rather than a bug: see the runs in results.json."),
            "", *table(["method", "identical"], rows), ""]


def _checks(doc: dict) -> list[str]:
    problems, warnings = doc.get("checks", []), doc.get("warnings", [])
    errors = [r for r in doc["runs"] if "error" in r]
    lines = ["## Consistency checks", ""]
    if not problems:
        lines.append("All consistent: token counts match, rates are positive, acceptance counts add up.")
    lines += _listed(problems, 50, "checks")
    if errors:
        lines.append(f"\n{len(errors)} run(s) failed; see results.json \"runs\" (key \"error\").")
    lines += [f"\nThe engine was restarted after: {reason}" for reason in doc.get("engine_restarts", [])]
    if warnings:
        lines += ["", (f"Warnings ({len(warnings)}): the engine's own statistics disagree with its tokens. The "
                       "figures above count tokens themselves and do not use these statistics."), ""]
        lines += _listed(warnings, 20, "warnings")
    return lines + [""]


def _listed(items: list[str], most: int, key: str) -> list[str]:
    more = [f"- ... and {len(items) - most} more (results.json \"{key}\")"] if len(items) > most else []
    return [f"- {item}" for item in items[:most]] + more


def _definitions(doc: dict) -> list[str]:
    target = doc["settings"].get("engine_config", {}).get("target", {})
    borrow = " (the target borrows the draft's cores for the prompt prefill)" \
        if target.get("prefill_borrows_draft_cores") else ""
    return ["## Definitions", "",
            ("- tok/s: new tokens / wall seconds, pooled over a category's prompts, measured by the caller "
             "(the engine's figures include the request's trip through the scheduler)."),
            ("- Avg.: mean of the per-category figures. Speedup: tok/s over vanilla's, same category and decoding; "
             "vs target-only: over the engine's `target` method's."),
            ("- TTFT: time until the first new token is out (baselines: a generate streamer; engine: the "
             "client's first streamed text)."),
            ("- llama.cpp via llama-cpp-python (the `llama.cpp*` rows) decodes the target's own GGUF file through llama-cpp-"
             "python's C API with llama.cpp's default settings, in the benchmark process; greedy reads each step's argmax "
             "from the logits with numpy, sampling uses llama.cpp's sampler chain (temperature, top-p, a seeded draw). The "
             "`llama-*` rows run llama.cpp's own C++ programs on the same file and cores (scripts/build_llama_cpp.sh; their "
             "section above)."),
            ("- Vanilla and PLD run in the benchmark process and may use every core; the engine's draft and target "
             f"each own their cores{borrow}. A busy machine (see the load average) hurts multi-threaded "
             "baselines most: compare runs made under similar load."), ""]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = Path(argv[0] if argv else "bench-out/results.json")
    doc = complete(json.loads(path.read_text()))      # the figures, and the rules, may have changed since the run
    doc["checks"] = check_results(doc)
    path.write_text(json.dumps(doc, indent=1))
    plots = sorted(str(p) for p in path.parent.glob("*.png"))
    print(write_report(doc, path.parent, plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
