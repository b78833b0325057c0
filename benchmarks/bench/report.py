"""report.md from a results document, in the shape of the paper's Tables 1-3. It reads results.json
only, so a report can be rebuilt (with the figures and checks of today's code) without a run:

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


def write_report(doc: dict, out_dir: str | Path) -> Path:
    lines = ["# hetspec benchmark report", "", *_header(doc), *_methods_table(doc)]
    for decoding in doc["settings"]["decodings"]:
        lines += tables.table1(doc, decoding)
    for section in (tables.tokens_table, tables.llama_cpp_table, tables.table2, tables.acceptance_table,
                    tables.sequences_table, tables.profile_table, _ceiling, _exactness, _checks):
        lines += section(doc)
    path = Path(out_dir) / "report.md"
    path.write_text("\n".join(lines + _definitions(doc)))
    return path


def _header(doc: dict) -> list[str]:
    s, m, budget = doc["settings"], doc["machine"], doc["engine"].get("budget") or {}
    prompts = len({(r["category"], r["question_id"]) for r in doc["runs"]})
    return [f"Run {doc['created']} in {doc['duration_s']:.0f} s: `{doc['command']}`", "",
            (f"- **Machine**: {m['cpu']}, {m['logical_cores']} logical cores (affinity {m['affinity']}), "
             f"{m['memory_gb']} GB, {m.get('isa', 'instruction set not recorded')}"
             f"{'; GPU ' + m['gpu'] if m.get('gpu') else '; no GPU'}; load average (1, 5, 15 min) "
             f"{m.get('load_average_start')} at the start, {m.get('load_average')} at the end; "
             f"git {m.get('git_commit')}"),
            "- **Phases** (s): " + ", ".join(f"{k.replace('_', ' ')} {v:.0f}" for k, v in doc.get("phases_s", {})
                                              .items()),
            "- **Software**: " + ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v),
            f"- **Models**: draft `{s['draft_model']}`, target `{s['target_model']}`; {_models(s, doc['engine'])}",
            f"- **Draft budget**: gamma = **{doc['chosen_gamma']}** ({budget.get('source', '?')})" + _budget(budget),
            (f"- **Prompts**: {prompts} prompts in {len(s['categories'])} categories ({s['limit'] or 'all'} per "
             f"category, first turn, {s['prompt_format']} format); new tokens per category: "
             + ", ".join(f"{TITLES[c]} {n}" for c, n in s["max_new_tokens"].items())),
            "- **Decoding**: " + "; ".join(f"{d} (temperature {p['temperature']}, top_p {p['top_p']}, top_k 0)"
                                            for d, p in s["decodings"].items()), ""]


def _models(s: dict, e: dict) -> str:
    """How the target's numbers compare between the engine and the baselines, and how the workers run."""
    if s.get("target_backend") in GGUF_TARGET_BACKENDS:
        runner = "hetspec's kernels" if s["target_backend"] == "native" else "llama.cpp"
        target = (f"the engine's target computes the GGUF file's own blocks through {runner}, as the llama.cpp rows "
                  f"compute that file; vanilla and PLD run it in **{s['dtype']}**")
    else:
        target = f"target dtype **{s['dtype']}** for the engine and every baseline"
    kernels = [f"{role} runs {(e.get(role) or {}).get('kernels')}" for role in ("draft", "target")
               if (e.get(role) or {}).get("kernels")]         # older results lack the field
    if kernels and e.get("prompt_kv") == "target":
        kernels[0] += ", takes the target's cache of a prompt (prompt_kv)"
    return f"{target}; engine config {s['config']}" + (
        "; engine " + ", ".join(kernels) + " (baselines: transformers' defaults)" if kernels else "")


def _budget(budget: dict) -> str:
    if budget.get("source") != "measured":
        return ""
    verify = ", ".join(f"{n}: {1000 * t:.0f}" for n, t in budget.get("verify_s", {}).items())
    prefill = budget.get("draft_prefill_s_per_token")
    return (f": draft {1000 * budget['draft_s_per_token']:.1f} ms/token"
            + (f", {1000 * prefill:.1f} ms a prompt token" if prefill else "")
            + f"; verify ms by tokens {{{verify}}} at a {budget.get('context')}-token context. `duodec` and "
            "`duodec-s*` start at gamma, then draft each round as long as the target verifies; SpS drafts the window "
            "of least expected time per token; `sps-fixed` drafts gamma every round. `sps` and `duodec` may rest "
            "from speculating, as a user's requests do; the ablations force speculation")


def _methods_table(doc: dict) -> list[str]:
    rows = []
    for name, m in doc["methods"].items():
        gamma = "-" if m.get("gamma") is None else f"{m['gamma']}, rebalanced" if m.get("rebalanced") else m["gamma"]
        rows.append([f"`{name}`", m["label"], str(gamma), str("-" if m.get("sequences") is None else m["sequences"]),
                     m["dtype"], _resources(m)])
    section = doc.get("llama_cpp") or {}
    for name, m in section.get("methods", {}).items():
        draft = f", draft `{Path(m['draft']).name}`" if m.get("draft") else ""
        where = f"{m['device']}, cores {m['cores']} (taskset), {m['threads']} thread(s) (`{m['tool']}`{draft}; "
        rows.append([f"`{name}`", m["label"], "-", "-", m["dtype"], f"{where}{m['settings']})"])
    return ["## Methods and resources", "",
            *table(["method", "what", "gamma", "sequences", "dtype", "cores and threads"], rows), "",
            *([f"{section['missing']}.", ""] if section.get("missing") else [])]


def _resources(m: dict) -> str:
    """Where a method computed: the benchmark process's cores, or the engine's workers'."""
    if "cores" in m:
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
    if "tokens_per_s" not in c:
        return ["## The draft model alone (ceiling)", "",
                f"Not measured: {c.get('skipped') or c.get('error') or 'not measured'}.", ""]
    weights = f", weights {c['weights']} as in the engine" if c.get("weights", "as-is") != "as-is" else ""
    lines = ["## The draft model alone (ceiling)", "",
             (f"{'The native draft' if c.get('backend') == 'native' else 'llama.cpp'} greedy on the draft's cores "
              f"{c['cores']} with {c['threads']} thread(s){weights}: **{c['tokens_per_s']:.1f} tok/s** "
              f"({c['ms_per_token']:.2f} ms/token after the prompt; prompt prefill {c['prefill_ms_per_token']:.2f} "
              f"ms/token; {c['prompts']} prompts). DuoDecoding cannot decode faster than its draft drafts, however "
              "often the two agree.")]
    for d, fraction in (c.get("duodec_fraction") or {}).items():
        avg = doc["results"][d]["duodec"]["average"]
        lines.append(f"- {d}: DuoDecoding decodes at {avg['decode_tokens_per_s']:.1f} tok/s after its first token "
                     f"(**{fraction:.0%} of the ceiling**; {avg['tokens_per_s']:.1f} tok/s including the prompt)")
    return lines + [""]


def _exactness(doc: dict) -> list[str]:
    reference = greedy_reference(doc["settings"])
    rows = [[f"`{name}`", pct(cells["average"]["exact_match"])] for name, cells in doc["results"].get("greedy", {})
            .items() if name != reference and cells.get("average", {}).get("exact_match") is not None]
    if not rows:
        return []
    if reference == "target":
        return ["## Greedy output identical to the target alone", "",
                ("Share of prompts whose greedy tokens equal the engine's `target` method's (the GGUF target "
                 "computes the GGUF file's blocks, and its verification is batch-invariant, so any speculative "
                 "method must give them exactly)."), "", *table(["method", "identical"], rows), ""]
    return ["## Greedy output identical to vanilla", "",
            ("Share of prompts whose greedy tokens equal transformers `generate`'s. Below 100% can be a float "
             "near-tie (batched verification, another thread count) rather than a bug: see the runs in results.json."),
            "", *table(["method", "identical"], rows), ""]


def _checks(doc: dict) -> list[str]:
    problems, warnings = doc.get("checks", []), doc.get("warnings", [])
    errors = [r for r in doc["runs"] if "error" in r]
    lines = ["## Consistency checks", "",
             *([] if problems else ["All consistent: token counts match, rates are positive, acceptance adds up."]),
             *_listed(problems, 50, "checks"),
             *([f"\n{len(errors)} run(s) failed; see results.json \"runs\" (key \"error\")."] if errors else [])]
    if warnings:
        lines += ["", (f"Warnings ({len(warnings)}): the engine's own statistics disagree with its tokens. The "
                       "figures above count tokens themselves and do not use these statistics."), "",
                  *_listed(warnings, 20, "warnings")]
    return lines + [""]


def _listed(items: list[str], most: int, key: str) -> list[str]:
    more = [f"- ... and {len(items) - most} more (results.json \"{key}\")"] if len(items) > most else []
    return [f"- {item}" for item in items[:most]] + more


def _definitions(doc: dict) -> list[str]:
    borrow = (" (the target borrows the draft's cores for the prompt prefill)" if doc["settings"].get(
        "engine_config", {}).get("target", {}).get("prefill_borrows_draft_cores") else "")
    return ["## Definitions", "",
            ("- tok/s: new tokens / wall seconds, pooled over a category's prompts, measured by the caller "
             "(the engine's figures include the request's trip through the scheduler)."),
            ("- Avg.: mean of the per-category figures. Speedup: tok/s over vanilla's, same category and decoding; "
             "vs target-only: over the engine's `target` method's."),
            ("- TTFT: time until the first new token is out (baselines: a generate streamer; engine: the "
             "client's first streamed text)."),
            ("- The `llama-*` rows run llama.cpp's own C++ programs on the target's GGUF file and the benchmark "
             "process's cores (scripts/build_llama_cpp.sh; their section above)."),
            ("- Vanilla and PLD run in the benchmark process and may use every core; the engine's draft and target "
             f"each own their cores{borrow}. A busy machine (see the load average) hurts multi-threaded "
             "baselines most: compare runs made under similar load."), ""]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = Path(argv[0] if argv else "bench-out/results.json")
    doc = complete(json.loads(path.read_text()))      # the figures, and the rules, may have changed since the run
    doc["checks"] = check_results(doc)
    path.write_text(json.dumps(doc, indent=1))
    print(write_report(doc, path.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
