"""The report's results tables (report.py puts them in order), each read from a results document; and the
formatting and writing every benchmark's report shares."""
from __future__ import annotations

import json
from pathlib import Path

from hetspec.benchmarks.bench.data import TITLES
from hetspec.benchmarks.bench.methods import CPP_PEER


def _averages(doc: dict, key: str) -> list[tuple]:
    """(decoding, method, its average cell's `key`) of the methods whose average has one."""
    return [(d, name, cells["average"][key]) for d in doc["settings"]["decodings"]
            for name, cells in doc["results"][d].items() if cells.get("average", {}).get(key)]


def table1(doc: dict, decoding: str) -> list[str]:
    cats, section = doc["settings"]["categories"], doc.get("llama_cpp") or {}
    vs_llama = (section.get("vs") or {}).get(decoding, {})        # decode tok/s over llama-bench's, by method
    rows = []
    for name in doc["methods"]:
        cells = doc["results"][decoding].get(name, {})
        avg = cells.get("average", {})
        rows.append([f"`{name}`", *[times(cells.get(c, {}).get("speedup")) for c in cats],
                     times(avg.get("speedup"), bold=True), times(avg.get("vs_target"), bold=True),
                     times((vs_llama.get(name) or {}).get("average"), bold=True), num(avg.get("tokens_per_s"))])
    about = (f"decode tok/s after the first token over `{CPP_PEER}`'s, llama.cpp's own C++ benchmark decoding the "
             "same GGUF file at each prompt's depth on every core (per category, then averaged)")
    if not section.get("vs"):
        about = section.get("missing") or f"none: `{CPP_PEER}` did not run"
    return [f"## Table 1 ({decoding}): speedup over vanilla, over the engine's target-only mode, and over llama.cpp",
            "", ("Per category: over vanilla. The target-only column divides by the engine running the target alone "
                 "(`target`), which has the engine's kernels but no draft: it is the speculative gain alone. The "
                 f"llama.cpp column: {about}."), "",
            *table(["method", *[TITLES[c] for c in cats], "Avg. vs vanilla", "Avg. vs target-only",
                    "Avg. vs llama.cpp", "tok/s (avg)"], rows), ""]


def _per_category(cells: dict, cats: list[str], key: str) -> list[str]:
    """A figure per category, then its average (bold)."""
    return [*[num(cells.get(c, {}).get(key)) for c in cats], num(cells.get("average", {}).get(key), bold=True)]


def llama_cpp_table(doc: dict) -> list[str]:
    """llama.cpp's own C++ programs beside the engine: decode tok/s per category."""
    section, cats = doc.get("llama_cpp") or {}, doc["settings"]["categories"]
    if not section:
        return []
    if section.get("missing"):
        return ["## llama.cpp's own binaries (C++)", "", f"{section['missing']}.", ""]
    rows = []
    for name, m in section["methods"].items():
        cells = section.get("results", {}).get(name, {})
        what = f"{m['tool']}{'' if m['mode'] in ('bench', 'spec') else ' ' + m['mode']}, {m['threads']} thread(s)"
        if "draft_length" in m:
            what += f", `--spec-draft-n-max` {m['draft_length']}"
        drafted = cells.get("average", {}).get("drafted")
        rows.append([f"`{name}`", what, *_per_category(cells, cats, "decode_tokens_per_s"),
                     "none drafted" if drafted == 0 else pct(cells.get("average", {}).get("acceptance_rate"))])
    first = next(iter(doc["settings"]["decodings"]))
    for name in ("target", "sps", "duodec"):          # the engine's decode tok/s beside them
        cells = doc["results"].get(first, {}).get(name)
        if cells:
            rows.append([f"`{name}`", f"{first}, after the first token",
                         *_per_category(cells, cats, "decode_tokens_per_s"),
                         pct(cells.get("average", {}).get("acceptance_rate"))])
    return ["## llama.cpp's own binaries (C++)", "",
            ("Decode tok/s on the target's GGUF file, per category pooled over its prompts, beside the engine's decode "
             "tok/s after its first token. `llama-bench`: `llama-bench -p 0 -n NEW -d PROMPT -r 3 -o json` per prompt "
             "(NEW one-token decodes after a PROMPT-token context: the positions the engine decodes), the mean of the "
             "repetitions. `llama-speculative-simple` (greedy, the prompt's text): its \"decoded N tokens in S "
             "seconds\", from the prompt's last token. Same cores as the benchmark process; every C++ row runs once "
             "per prompt, between the other methods."), "",
            *table(["row", "what", *[TITLES[c] for c in cats], "Avg. decode tok/s", "acceptance"], rows), "",
            *_cpp_notes(section), ""]


def _cpp_notes(section: dict) -> list[str]:
    notes = [f"- `{name}` not run: {why}." for name, why in section.get("skipped", {}).items()]
    errors = [r for r in section.get("runs", []) if "error" in r]
    if errors:
        notes.append(f"- {len(errors)} C++ run(s) failed, the first: {errors[0]['method']}: {errors[0]['error']}")
    build = section.get("build_info")
    return notes + [f"- Binaries: `{section.get('binaries')}`" + (f" ({'; '.join(build.splitlines()[:3])})"
                                                                  if build else "")]


def _per_decoding(doc: dict, columns: list[tuple]) -> list[str]:
    """A row per method, and for each decoding the columns (title, figure(average cell, decoding))."""
    decodings = doc["settings"]["decodings"]
    header = ["method", *[f"{d} {title}" for d in decodings for title, _ in columns]]
    rows = [[f"`{name}`", *[figure(average(doc, d, name), d) for d in decodings for _, figure in columns]]
            for name in doc["methods"]]
    return table(header, rows)


def table2(doc: dict) -> list[str]:
    def vs_sps(avg: dict, decoding: str):
        sps = average(doc, decoding, "sps")
        return pct(avg["ttft_s"] / sps["ttft_s"] if avg.get("ttft_s") and sps.get("ttft_s") else None)

    columns = [("TTFT ms", lambda avg, d: num(avg.get("ttft_s") and 1000 * avg["ttft_s"], 0)),
               ("vs vanilla", lambda avg, d: pct(avg.get("ttft_rel"))), ("vs SpS", vs_sps)]
    return ["## Table 2: time to first token", "",
            "Mean over prompts, averaged over categories; relative figures are per category, then averaged.", "",
            *_per_decoding(doc, columns), ""]


def acceptance_table(doc: dict) -> list[str]:
    columns = [("acceptance", lambda avg, d: pct(avg.get("acceptance_rate"))),
               ("tokens/round", lambda avg, d: num(avg.get("mean_accepted_per_round"), 2)),
               ("lookup acceptance", lambda avg, d: pct(avg.get("lookup_acceptance"))),
               ("from draft", lambda avg, d: pct(avg.get("from_draft"))),
               ("from lookup", lambda avg, d: pct(avg.get("from_lookup")))]
    return ["## Acceptance rate and tokens committed per round", "",
            ("Acceptance: accepted / drafted tokens. Tokens per round: tokens committed per speculative round "
             "(accepted draft tokens plus the target's own token). Lookup: the prompt-lookup guesses verified "
             "in target-only rounds and after a speculative round's drafted window (accepted / guessed tokens), "
             "and the share of all new tokens they committed; from draft: the share the draft's accepted tokens "
             "committed (the rest are the target's own)."), "", *_per_decoding(doc, columns), ""]


def sequences_table(doc: dict) -> list[str]:
    rows = [(d, name, hist) for d, name, hist in _averages(doc, "sequences_hist")
            if doc["methods"][name]["mode"] == "duodec"]
    if not rows:
        return []
    ks = sorted({k for _, _, hist in rows for k in hist}, key=int)
    body = [[d, f"`{name}`", *[pct(hist.get(k, 0) / sum(hist.values())) for k in ks], str(sum(hist.values()))]
            for d, name, hist in rows]
    return ["## Number of draft sequences per round", "",
            *table(["decoding", "method", *[f"k={k}" for k in ks], "rounds"], body), ""]


def profile_table(doc: dict) -> list[str]:
    rows = [[d, f"`{name}`", *[num(p[k], 1) for k in ("draft", "verify", "round")],
             num(p["round"] - p["draft"], 1), num(p["round"] - p["verify"], 1), num(p["overhead"], 1),
             pct(p["overhead"] / p["round"] if p["round"] else None), str(p["rounds"])]
            for d, name, p in _averages(doc, "profile_ms")]
    if not rows:
        return []
    return ["## Per-round time profile (ms per speculative round)", "",
            ("Draft and verify are each worker's compute; DuoDecoding runs them at once, SpS one after the other. "
             "Idle: the round's wall time less that side's compute. Overhead is the round's wall time minus the "
             "busy part (the longer side, or both for SpS): IPC, Python and numpy in the scheduler."), "",
            *table(["decoding", "method", "draft", "verify", "round", "draft idle", "target idle", "overhead",
                    "overhead share", "rounds"], rows), ""]


# ---- formatting and writing ---------------------------------------------------------

def write_outputs(out, doc: dict, report: str, names: tuple[str, str] = ("results.json", "report.md")) -> Path:
    """OUT/results.json and OUT/report.md (OUT made where missing); the report's path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / names[0]).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out / names[1]).write_text(report)
    return out / names[1]


def average(doc: dict, decoding: str, name: str) -> dict:
    return doc["results"][decoding].get(name, {}).get("average", {})


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def num(value, digits: int = 1, bold: bool = False, unit: str = "") -> str:
    text = "-" if value is None else f"{value:.{digits}f}{unit}"
    return f"**{text}**" if bold and value is not None else text


def times(value, bold: bool = False) -> str:
    return num(value, 2, bold, "x")


def pct(value) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"
