"""report.md from a results document, in the shape of the paper's Tables 1 and 2: it reads results.json only."""
from __future__ import annotations

from pathlib import Path

from hetspec.benchmarks.bench import tables
from hetspec.benchmarks.bench.data import TITLES
from hetspec.benchmarks.bench.metrics import greedy_reference
from hetspec.benchmarks.bench.tables import pct, table
from hetspec.ipc.specs import GGUF_TARGET_BACKENDS


def render(doc: dict) -> str:
    lines = ["# hetspec benchmark report", "", *_header(doc), *_methods_table(doc)]
    for decoding in doc["settings"]["decodings"]:
        lines += tables.table1(doc, decoding)
    for section in (tables.llama_cpp_table, tables.table2, tables.acceptance_table, tables.sequences_table,
                    tables.profile_table, _exactness, _checks, _definitions):
        lines += section(doc)
    return "\n".join(lines)


def _header(doc: dict) -> list[str]:
    s, m, budget = doc["settings"], doc["machine"], doc["engine"].get("budget") or {}
    prompts = len({(r["category"], r["question_id"]) for r in doc["runs"]})
    return [f"Run {doc['created']} in {doc['duration_s']:.0f} s: `{doc['command']}`", "",
            (f"- **Machine**: {m['cpu']}, {m['logical_cores']} logical cores (affinity {m['affinity']}), "
             f"{m['memory_gb']} GB, {m['isa']}{'; GPU ' + m['gpu'] if m['gpu'] else '; no GPU'}; load average (1, 5, 15 "
             f"min) {m['load_average_start']} at the start, {m['load_average']} at the end; git {m['git_commit']}"),
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
                  f"compute that file; vanilla runs it in **{s['dtype']}**")
    else:
        target = f"target dtype **{s['dtype']}** for the engine and every baseline"
    kernels = [f"{role} runs {e[role]['kernels']}" for role in ("draft", "target") if e[role].get("kernels")]
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
            + f"; verify ms by tokens {{{verify}}} at a {budget.get('context')}-token context (benchmarks/README.md, "
            "`--methods`, says how each method drafts)")


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
        return f"{m['device']}, cores {m['cores']}, {m['threads']} thread(s) (benchmark process)"
    target = f"{m['device']}, cores {m['target_cores']}, {m['target_threads']} thread(s)"
    if "draft_cores" in m:
        return f"draft: cores {m['draft_cores']}, {m['draft_threads']} thread(s); target: {target}"
    return f"target: {target}"


def _exactness(doc: dict) -> list[str]:
    reference = greedy_reference(doc["settings"])
    rows = [[f"`{name}`", pct(cells["average"]["exact_match"])] for name, cells in doc["results"].get("greedy", {})
            .items() if name != reference and cells.get("average", {}).get("exact_match") is not None]
    if not rows:
        return []
    if reference == "target":
        title, about = "the target alone", ("Share of prompts whose greedy tokens equal the engine's `target` "
                                            "method's (the GGUF target computes the GGUF file's blocks, and its "
                                            "verification is batch-invariant, so any speculative method must give "
                                            "them exactly).")
    else:
        title, about = "vanilla", ("Share of prompts whose greedy tokens equal transformers `generate`'s. Below 100% "
                                   "can be a float near-tie (batched verification, another thread count) rather than "
                                   "a bug: see the runs in results.json.")
    return [f"## Greedy output identical to {title}", "", about, "", *table(["method", "identical"], rows), ""]


def _checks(doc: dict) -> list[str]:
    problems, errors, most = doc["checks"], [r for r in doc["runs"] if "error" in r], 50
    return ["## Consistency checks", "",
            *([] if problems else ["All consistent: token counts match, rates are positive, acceptance adds up."]),
            *[f"- {problem}" for problem in problems[:most]],
            *([f"- ... and {len(problems) - most} more (results.json \"checks\")"] if len(problems) > most else []),
            *([f"\n{len(errors)} run(s) failed; see results.json \"runs\" (key \"error\")."] if errors else []), ""]


def _definitions(doc: dict) -> list[str]:
    return ["## Definitions", "",
            ("- tok/s: new tokens / wall seconds, pooled over a category's prompts, measured by the caller (the "
             "engine's include the request's trip through the scheduler). Avg.: the mean of the categories' figures."),
            ("- TTFT: time until the first new token is out (baselines: a generate streamer; engine: the "
             "client's first streamed text)."),
            ("- Vanilla runs in the benchmark process and may use every core; the engine's draft and target each own "
             "their cores. A busy machine (see the load average) hurts multi-threaded baselines most: compare runs "
             "made under similar load."), ""]
