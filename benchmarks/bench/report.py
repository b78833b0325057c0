"""report.md from a results document, in the shape of the paper's Tables 1-3.

Everything here reads results.json only, so a report can be rebuilt (or
restyled) without re-running anything:

    python -m hetspec.benchmarks.bench.report bench-out/quick/results.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from hetspec.benchmarks.bench.checks import check_results
from hetspec.benchmarks.bench.data import TITLES
from hetspec.benchmarks.bench.llama_bin import REFERENCE, summarize, versus
from hetspec.benchmarks.bench.methods import PEER, SWEEP
from hetspec.benchmarks.bench.metrics import aggregate
from hetspec.ipc.specs import GGUF_TARGET_BACKENDS


def render_report(doc: dict, plots: list[str] = ()) -> str:
    s = doc["settings"]
    lines = ["# hetspec benchmark report", ""]
    lines += _header(doc)
    lines += _methods_table(doc)
    for decoding in s["decodings"]:
        lines += _table1(doc, decoding)
    lines += _tokens_table(doc)
    lines += _llama_cpp(doc)
    lines += _table2(doc)
    lines += _acceptance_table(doc)
    lines += _table3(doc)
    lines += _sequences_table(doc)
    lines += _poor_draft(doc)
    lines += _profile_table(doc)
    lines += _ceiling(doc)
    lines += _exactness(doc)
    lines += _checks(doc)
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots] + [""]
    lines += _definitions(doc)
    return "\n".join(lines)


def write_report(doc: dict, out_dir: str | Path, plots: list[str] = ()) -> Path:
    path = Path(out_dir) / "report.md"
    path.write_text(render_report(doc, plots))
    return path


# ---- sections ------------------------------------------------------------------

def _header(doc: dict) -> list[str]:
    s, m, e = doc["settings"], doc["machine"], doc["engine"]
    budget = e.get("budget") or {}
    cpu = f"{m['cpu']}, {m['logical_cores']} logical cores (affinity {m['affinity']}), {m['memory_gb']} GB"
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
    """How the engine's workers run their models (results without this field predate it)."""
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
    return (f": draft {1000 * budget['draft_s_per_token']:.1f} ms/token{prefill}; verify ms by tokens {{{verify}}} "
            f"at a {budget.get('context')}-token context. `duodec` and the `duodec-s*` methods start at gamma and "
            f"then draft each round for as long as the target verifies, from the rounds' own timings; SpS drafts "
            f"each round the window of least expected time per token, from the same timings and the acceptance "
            f"seen so far; the sweep (`gamma-2` .. `gamma+2`) fixes gamma. `sps` and `duodec` may rest from "
            f"speculating where it does not pay, as a user's requests do; the ablations (`sps-fixed`, "
            f"`duodec-s*`, the sweep) force speculation, so each measures its own configuration")


def _prompt_count(doc: dict) -> str:
    keys = {(r["category"], r["question_id"]) for r in doc["runs"]}
    return f"{len(keys)} prompts in {len(doc['settings']['categories'])} categories"


def _methods_table(doc: dict) -> list[str]:
    rows = []
    for name, m in doc["methods"].items():
        if m["kind"] == "peer":
            where = f"{m['device']}, cores {m['cores']}, {m['threads']} thread(s) (benchmark process; {m['settings']})"
        elif m["kind"] == "baseline":
            trial = m.get("thread_trial_tokens_per_s")
            why = ("; chosen as the faster on short and long prompt probes, prefill included: "
                   + ", ".join(f"{t} thread(s) {v:.1f} tok/s" for t, v in trial.items())
                   if trial else "")
            where = f"{m['device']}, cores {m['cores']}, {m['threads']} thread(s) (benchmark process{why})"
        elif "draft_cores" in m:
            where = (f"draft: cores {m['draft_cores']}, {m['draft_threads']} thread(s); target: {m['device']}, "
                     f"cores {m['target_cores']}, {m['target_threads']} thread(s)")
        else:
            where = f"target: {m['device']}, cores {m['target_cores']}, {m['target_threads']} thread(s)"
        gamma = "-" if m.get("gamma") is None else f"{m['gamma']}, rebalanced" if m.get("rebalanced") else m["gamma"]
        seqs = "-" if m.get("sequences") is None else m["sequences"]
        rows.append([f"`{name}`", m["label"], str(gamma), str(seqs), m["dtype"], where])
    section = doc.get("llama_cpp") or {}
    for name, m in section.get("methods", {}).items():
        lengths = f", draft `{Path(m['draft']).name}`" if m.get("draft") else ""
        where = (f"{m['device']}, cores {m['cores']} (taskset), {m['threads']} thread(s) (`{m['tool']}`{lengths}; "
                 f"{m['settings']})")
        rows.append([f"`{name}`", m["label"], "-", "-", m["dtype"], where])
    note = [f"{section['missing']}.", ""] if section.get("missing") else []
    return ["## Methods and resources", "",
            *_table(["method", "what", "gamma", "sequences", "dtype", "cores and threads"], rows), "", *note]


def _table1(doc: dict, decoding: str) -> list[str]:
    vs_llama, about = _vs_llama(doc)
    cats = doc["settings"]["categories"]
    res = doc["results"][decoding]
    rows = []
    for name in doc["methods"]:
        cells = res.get(name, {})
        rows.append([f"`{name}`", *[_x(cells.get(c, {}).get("speedup")) for c in cats],
                     _x(cells.get("average", {}).get("speedup"), bold=True),
                     _x(cells.get("average", {}).get("vs_target"), bold=True),
                     _x(vs_llama(decoding, name), bold=True),
                     _f(cells.get("average", {}).get("tokens_per_s"))])
    title = f"## Table 1 ({decoding}): speedup over vanilla, over the engine's target-only mode, and over llama.cpp"
    note = ("Per category: over vanilla. The target-only column divides by the engine running the target alone "
            "(`target`), which has the engine's kernels but no draft: it is the speculative gain alone. The "
            f"llama.cpp column: {about}.")
    return [title, "", note, "", *_table(["method", *[TITLES[c] for c in cats], "Avg. vs vanilla",
                                          "Avg. vs target-only", "Avg. vs llama.cpp", "tok/s (avg)"], rows), ""]


def _tokens_table(doc: dict) -> list[str]:
    cats = doc["settings"]["categories"]
    out = ["## Tokens per second", ""]
    for decoding in doc["settings"]["decodings"]:
        res = doc["results"][decoding]
        rows = [[f"`{n}`", *[_f(res.get(n, {}).get(c, {}).get("tokens_per_s")) for c in cats],
                 _f(res.get(n, {}).get("average", {}).get("tokens_per_s"))] for n in doc["methods"]]
        out += [f"{decoding}:", "", *_table(["method", *[TITLES[c] for c in cats], "Avg."], rows), ""]
    return out


def _vs_llama(doc: dict):
    """(figure(decoding, method), what it divides by): the report's "vs llama.cpp" divides the
    decode tok/s after the first token by llama-bench's at the same prompts where that row
    ran; else results.json's vs_llama (tok/s over the llama-cpp-python row's)."""
    cpp = versus(doc)
    if cpp:
        return (lambda d, name: cpp.get(d, {}).get(name, {}).get("average"),
                (f"decode tok/s after the first token over `{REFERENCE}`'s, llama.cpp's own C++ benchmark decoding "
                 "the same GGUF file at each prompt's depth on every core (per category, then averaged; see "
                 "\"llama.cpp's own binaries\")"))
    why = (doc.get("llama_cpp") or {}).get("missing")
    return (lambda d, name: doc["results"][d].get(name, {}).get("average", {}).get("vs_llama"),
            (f"tok/s over `{PEER}`'s: llama.cpp via llama-cpp-python (a Python loop) decoding the target's GGUF file "
             "on every core" + (f". {why[0].upper()}{why[1:]}" if why else "")))


def _llama_cpp(doc: dict) -> list[str]:
    """llama.cpp's own C++ programs beside the engine: decode tok/s per category."""
    section = doc.get("llama_cpp") or {}
    if not section:
        return []
    lines = ["## llama.cpp's own binaries (C++)", ""]
    if section.get("missing"):
        return lines + [f"{section['missing']}.", ""]
    cats = doc["settings"]["categories"]
    results = summarize(section.get("runs", []), cats)
    first = next(iter(doc["settings"]["decodings"]))
    rows = []
    for name, m in section["methods"].items():
        cells = results.get(name, {})
        what = f"{m['tool']}{'' if m['mode'] in ('bench', 'spec') else ' ' + m['mode']}, {m['threads']} thread(s)"
        if "draft_length" in cells:
            what += f", `--spec-draft-n-max` {cells['draft_length']} (" + ", ".join(
                f"{n}: {_f(v['decode_tokens_per_s'])}" for n, v in cells["by_draft_length"].items()) + " tok/s)"
        rows.append([f"`{name}`", what, *[_f(cells.get(c, {}).get("decode_tokens_per_s")) for c in cats],
                     _f(cells.get("average", {}).get("decode_tokens_per_s"), bold=True),
                     "none drafted" if cells.get("average", {}).get("drafted") == 0 else
                     _pct(cells.get("average", {}).get("acceptance_rate"))])
    for name in (PEER, "target", "sps", "duodec"):
        cells = doc["results"].get(first, {}).get(name)
        if cells:
            rows.append([f"`{name}`", f"{first}, after the first token",
                         *[_f(cells.get(c, {}).get("decode_tokens_per_s")) for c in cats],
                         _f(cells.get("average", {}).get("decode_tokens_per_s"), bold=True),
                         _pct(cells.get("average", {}).get("acceptance_rate"))])
    lines += [("Decode tok/s on the target's GGUF file, per category pooled over its prompts, beside the engine's "
               "and llama-cpp-python's decode tok/s after their first token. `llama-bench`: "
               "`llama-bench -p 0 -n NEW -d PROMPT -r 3 -o json` per prompt (NEW one-token decodes after a "
               "PROMPT-token context: the positions the engine decodes), the mean of the repetitions. "
               "`llama-speculative-simple` (greedy, the prompt's text): its \"decoded N tokens in S seconds\", "
               "from the prompt's last token; the draft-model row keeps the draft length fastest on average. "
               "Same cores as the benchmark process; every C++ row runs once per prompt, interleaved with the "
               "other methods."), "",
              *_table(["row", "what", *[TITLES[c] for c in cats], "Avg. decode tok/s", "acceptance"], rows), ""]
    for name, why in section.get("skipped", {}).items():
        lines.append(f"- `{name}` not run: {why}.")
    for file, load in section.get("load_ms", {}).items():
        lines.append(f"- llama.cpp's own load time of `{file}`: " + (
            f"{load['load_ms']:.0f} ms (llama-completion's `load time`: the model and a context, up to its "
            "first evaluation)" if "load_ms" in load else f"not measured ({load.get('error')})"))
    errors = [r for r in section.get("runs", []) if "error" in r]
    if errors:
        lines.append(f"- {len(errors)} C++ run(s) failed, the first: {errors[0]['method']}: {errors[0]['error']}")
    lines.append(f"- Binaries: `{section.get('binaries')}`" + (
        " (" + "; ".join(section["build_info"].splitlines()[:3]) + ")" if section.get("build_info") else ""))
    return lines + [""]


def _table2(doc: dict) -> list[str]:
    decodings = doc["settings"]["decodings"]
    header = ["method"]
    for d in decodings:
        header += [f"{d} TTFT ms", f"{d} vs vanilla", f"{d} vs SpS"]
    rows = []
    for name in doc["methods"]:
        row = [f"`{name}`"]
        for d in decodings:
            avg = doc["results"][d].get(name, {}).get("average", {})
            sps = doc["results"][d].get("sps", {}).get("average", {})
            ttft = avg.get("ttft_s")
            row += [_f(ttft and 1000 * ttft, 0), _pct(avg.get("ttft_rel")),
                    _pct(ttft / sps["ttft_s"] if ttft and sps.get("ttft_s") else None)]
        rows.append(row)
    return ["## Table 2: time to first token", "",
            "Mean over prompts, averaged over categories; relative figures are per category, then averaged.", "",
            *_table(header, rows), ""]


def _acceptance_table(doc: dict) -> list[str]:
    decodings = doc["settings"]["decodings"]
    header = ["method"]
    for d in decodings:
        header += [f"{d} acceptance", f"{d} tokens/round", f"{d} lookup acceptance", f"{d} from lookup"]
    rows = []
    for name in doc["methods"]:
        row = [f"`{name}`"]
        for d in decodings:
            avg = doc["results"][d].get(name, {}).get("average", {})
            row += [_pct(avg.get("acceptance_rate")), _f(avg.get("mean_accepted_per_round"), 2),
                    _pct(avg.get("lookup_acceptance")), _pct(avg.get("from_lookup"))]
        rows.append(row)
    return ["## Acceptance rate and tokens committed per round", "",
            ("Acceptance: accepted / drafted tokens. Tokens per round: tokens committed per speculative round "
             "(accepted draft tokens plus the target's own token). Lookup: the prompt-lookup guesses that "
             "target-only rounds of `sps` and `duodec` verify (accepted / guessed tokens), and the share of "
             "all new tokens they committed."), "", *_table(header, rows), ""]


def _table3(doc: dict) -> list[str]:
    present = [n for n in SWEEP if n in doc["methods"]]
    if len(present) < 2:
        return []
    gammas = [doc["methods"][n]["gamma"] for n in present]
    vs_llama, _ = _vs_llama(doc)
    header = ["", *[f"{n} (gamma {g})" if n != "duodec" else
                    f"**chosen (gamma {g}{', rebalanced' if doc['methods'][n].get('rebalanced') else ''})**"
                    for n, g in zip(present, gammas, strict=True)]]
    rows = []
    for d in doc["settings"]["decodings"]:
        res = doc["results"][d]
        rows.append([f"{d} tok/s", *[_f(res.get(n, {}).get("average", {}).get("tokens_per_s")) for n in present]])
        rows.append([f"{d} speedup", *[_x(res.get(n, {}).get("average", {}).get("speedup")) for n in present]])
        rows.append([f"{d} vs target-only", *[_x(res.get(n, {}).get("average", {}).get("vs_target"))
                                               for n in present]])
        rows.append([f"{d} vs llama.cpp", *[_x(vs_llama(d, n)) for n in present]])
        rows.append([f"{d} tokens/round",
                     *[_f(res.get(n, {}).get("average", {}).get("mean_accepted_per_round"), 2) for n in present]])
    return ["## Table 3: gamma sweep around the chosen budget (dynamic sequences)", "", *_table(header, rows), ""]


def _sequences_table(doc: dict) -> list[str]:
    rows, ks = [], set()
    for d in doc["settings"]["decodings"]:
        for name, cells in doc["results"][d].items():
            hist = cells.get("average", {}).get("sequences_hist")
            if hist and doc["methods"][name]["mode"] == "duodec":
                ks |= set(hist)
                rows.append((d, name, hist))
    if not rows:
        return []
    ks = sorted(ks, key=int)
    table = []
    for d, name, hist in rows:
        total = sum(hist.values())
        table.append([d, f"`{name}`", *[_pct(hist.get(k, 0) / total) for k in ks], str(total)])
    return ["## Number of draft sequences per round", "",
            *_table(["decoding", "method", *[f"k={k}" for k in ks], "rounds"], table), ""]


def _poor_draft(doc: dict) -> list[str]:
    """A second engine, the same but for a draft that never agrees: what the gate saves."""
    names = [n for n in ("target", "poor", "poor-forced", "duodec") if n in doc["methods"]]
    if "poor" not in names:
        return []
    vs_llama, _ = _vs_llama(doc)
    rows = []
    for d in doc["settings"]["decodings"]:
        for name in names:
            avg = doc["results"][d].get(name, {}).get("average", {})
            tokens = avg.get("new_tokens")
            rows.append([d, f"`{name}`", _f(avg.get("tokens_per_s")), _x(avg.get("vs_target")),
                         _x(vs_llama(d, name)), _pct(avg.get("acceptance_rate")),
                         _pct(avg.get("rested", 0) / tokens if tokens else None)])
    draft = doc["engine"].get("poor_draft")
    return ["## A poor draft", "",
            (f"`poor` and `poor-forced` run on a second engine, the same but for its draft (`{draft}`, random "
             "weights: it never agrees). `poor` lets the engine rest from speculating while it does not pay "
             "(target-only rounds, probing again now and then); `poor-forced` asks for speculation on every "
             "round. Rested: the share of tokens decoded target-only by that choice."), "",
            *_table(["decoding", "method", "tok/s", "vs target-only", "vs llama.cpp", "acceptance", "rested"],
                    rows), ""]


def _profile_table(doc: dict) -> list[str]:
    rows = []
    for d in doc["settings"]["decodings"]:
        for name, cells in doc["results"][d].items():
            p = cells.get("average", {}).get("profile_ms")
            if p:
                share = p["overhead"] / p["round"] if p["round"] else None
                rows.append([d, f"`{name}`", _f(p["draft"], 1), _f(p["verify"], 1), _f(p["round"], 1),
                             _f(p["overhead"], 1), _pct(share), str(p["rounds"])])
    if not rows:
        return []
    return ["## Per-round time profile (ms per speculative round)", "",
            ("Draft and verify are each worker's compute; DuoDecoding runs them at once, SpS one after the other. "
             "Overhead is the round's wall time minus the busy part (the longer side, or both for SpS): IPC, "
             "Python and numpy in the scheduler."), "",
            *_table(["decoding", "method", "draft", "verify", "round", "overhead", "overhead share", "rounds"], rows),
            ""]


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
    rows = []
    for name, cells in doc["results"]["greedy"].items():
        match = cells.get("average", {}).get("exact_match")
        reference = "target" if doc["settings"].get("target_backend") in GGUF_TARGET_BACKENDS else "vanilla"
        if name != reference and match is not None:
            rows.append([f"`{name}`", _pct(match)])
    if not rows:
        return []
    if doc["settings"].get("target_backend") in GGUF_TARGET_BACKENDS:
        return ["## Greedy output identical to the target alone", "",
                ("Share of prompts whose greedy tokens equal the engine's `target` method's (the GGUF target "
                 "computes the GGUF file's blocks, and its verification is batch-invariant, so any speculative "
                 "method must give them exactly). llama.cpp's own rows use its default kernels, whose one-token "
                 "and batched logits differ: their share is how often they agree."),
                "", *_table(["method", "identical"], rows), ""]
    return ["## Greedy output identical to vanilla", "",
            ("Share of prompts whose greedy tokens equal transformers `generate`'s. Below 100% can be a float "
             "near-tie (batched verification, another thread count) rather than a bug: see the runs in results.json."),
            "", *_table(["method", "identical"], rows), ""]


def _checks(doc: dict) -> list[str]:
    problems = doc.get("checks", [])
    errors = [r for r in doc["runs"] if "error" in r]
    lines = ["## Consistency checks", ""]
    if not problems:
        lines.append("All consistent: token counts match, rates are positive, acceptance counts add up.")
    else:
        lines += [f"- {p}" for p in problems[:50]]
        if len(problems) > 50:
            lines.append(f"- ... and {len(problems) - 50} more (results.json \"checks\")")
    if errors:
        lines.append(f"\n{len(errors)} run(s) failed; see results.json \"runs\" (key \"error\").")
    for reason in doc.get("engine_restarts", []):
        lines.append(f"\nThe engine was restarted after: {reason}")
    warnings = doc.get("warnings", [])
    if warnings:
        lines += ["", (f"Warnings ({len(warnings)}): the engine's own statistics disagree with its tokens. The "
                       "figures above count tokens themselves and do not use these statistics."), ""]
        lines += [f"- {w}" for w in warnings[:20]]
        if len(warnings) > 20:
            lines.append(f"- ... and {len(warnings) - 20} more (results.json \"warnings\")")
    return lines + [""]


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
            ("- llama.cpp via llama-cpp-python (the `llama.cpp*` rows) decodes the target's own GGUF file through "
             "llama-cpp-python's C API with llama.cpp's default settings, in the benchmark process; greedy reads "
             "each step's argmax from the logits with numpy, sampling uses llama.cpp's sampler chain (temperature, "
             "top-p, a seeded draw). The `llama-*` rows run llama.cpp's own C++ programs on the same file and "
             "cores (scripts/build_llama_cpp.sh; their section above)."),
            ("- Vanilla and PLD run in the benchmark process and may use every core; the engine's draft and target "
             f"each own their cores{borrow}. A busy machine (see the load average) hurts multi-threaded "
             "baselines most: compare runs made under similar load."), ""]


# ---- formatting -----------------------------------------------------------------

def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def _f(value, digits: int = 1, bold: bool = False) -> str:
    text = "-" if value is None else f"{value:.{digits}f}"
    return f"**{text}**" if bold and value is not None else text


def _x(value, bold: bool = False) -> str:
    if value is None:
        return "-"
    text = f"{value:.2f}x"
    return f"**{text}**" if bold else text


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = Path(argv[0] if argv else "bench-out/results.json")
    doc = json.loads(path.read_text())
    doc["results"] = aggregate(doc)      # the figures, and the rules, may have changed since the run
    doc["checks"] = check_results(doc)
    if doc.get("llama_cpp", {}).get("runs"):
        doc["llama_cpp"]["results"] = summarize(doc["llama_cpp"]["runs"], doc["settings"]["categories"])
        doc["llama_cpp"]["vs"] = versus(doc)
    path.write_text(json.dumps(doc, indent=1))
    plots = sorted(str(p) for p in path.parent.glob("*.png"))
    print(write_report(doc, path.parent, plots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
