"""From per-run records to the paper's figures, per category and on average.

Per category, rates are pooled (total tokens / total seconds, as Spec-Bench), so a long prompt
weighs by its tokens; "average" is the mean of the categories' figures, as the paper's "Avg.",
its histograms and profiles pooled over every round. A figure that does not apply (acceptance of
a method that never drafts) is None, never 0."""
from __future__ import annotations

from collections import Counter
from statistics import mean

from hetspec.benchmarks.bench.methods import CPP_PEER
from hetspec.ipc.specs import GGUF_TARGET_BACKENDS

# figure -> (the method it divides by, the figure of that method)
RATIOS = {"speedup": ("vanilla", "tokens_per_s"), "vs_target": ("target", "tokens_per_s"), "ttft_rel": ("vanilla", "ttft_s")}
AVERAGED = ("tokens_per_s", "decode_tokens_per_s", "ttft_s", *RATIOS, "acceptance_rate", "lookup_acceptance",
            "from_draft", "from_lookup", "mean_accepted_per_round", "exact_match")
SUMMED = ("prompts", "new_tokens", "total_s", "spec_rounds", "rested")
PROFILE = ("draft", "verify", "round", "overhead")


def complete(doc: dict) -> dict:
    """Every figure of a results document from its runs: "results", and the C++ rows'."""
    doc["results"] = aggregate(doc)
    section = doc.get("llama_cpp")
    if section:
        section["results"] = summarize(section.get("runs", []), doc["settings"]["categories"])
        section["vs"] = versus(doc)
    return doc


def greedy_reference(settings: dict) -> str:
    """Whose greedy tokens the others must equal: a GGUF target's own, else vanilla's."""
    return "target" if settings.get("target_backend") in GGUF_TARGET_BACKENDS else "vanilla"


def aggregate(doc: dict) -> dict:
    runs, settings = [r for r in doc["runs"] if "error" not in r], doc["settings"]
    reference = greedy_reference(settings)
    reference_ids = {_key(r): r["token_ids"] for r in runs if r["method"] == reference}
    results: dict = {}
    for decoding in settings["decodings"]:
        exact = reference_ids if decoding == "greedy" else None
        results[decoding] = by_method = {
            m: _by_category([r for r in runs if r["decoding"] == decoding and r["method"] == m],
                            settings["categories"], lambda chosen, exact=exact: _cell(chosen, exact))
            for m in settings["methods"]}
        for cells in by_method.values():
            _add_ratios(cells, by_method)
    return results


def _add_ratios(cells: dict, by_method: dict) -> None:
    """Each cell's RATIOS, then the average cell."""
    for category, cell in cells.items():
        for name, (base_method, figure) in RATIOS.items():
            base = by_method.get(base_method, {}).get(category)
            cell[name] = _ratio(cell[figure], base and base[figure])
    if cells:
        cells["average"] = _average(list(cells.values()))


def _by_category(runs: list[dict], categories, cell) -> dict:
    return {c: cell(chosen) for c in categories if (chosen := [r for r in runs if r["category"] == c])}


def _key(run: dict) -> tuple:
    return run["decoding"], run["category"], run["question_id"]


def _total(runs: list[dict], key: str, zero=0):
    return sum(r.get(key, zero) for r in runs)


def _cell(runs: list[dict], reference_ids: dict | None) -> dict:
    tokens, seconds = _total(runs, "new_tokens"), _total(runs, "total_s")
    decode_tokens = sum(max(0, r["new_tokens"] - 1) for r in runs)
    decode_s = sum(max(0.0, r["total_s"] - r["ttft_s"]) for r in runs)
    drafted, spec_rounds = _total(runs, "drafted"), _total(runs, "spec_rounds")
    speculative = any(r.get("spec_rounds") or r.get("gamma") for r in runs)
    cell = {"prompts": len(runs), "new_tokens": tokens, "total_s": seconds,
            "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
            "decode_tokens_per_s": decode_tokens / decode_s if decode_s > 0 else None,
            "ttft_s": mean(r["ttft_s"] for r in runs),
            "acceptance_rate": _total(runs, "accepted") / drafted if drafted else (0.0 if speculative else None),
            "from_draft": _ratio(_total(runs, "accepted"), tokens) if drafted else None,
            "mean_accepted_per_round": _ratio(_total(runs, "committed_in_spec_rounds"), spec_rounds),
            "spec_rounds": spec_rounds, "rested": _total(runs, "rested"), "gamma": runs[0].get("gamma")}
    _add_pooled(cell, [r.get("sequences_hist") or {} for r in runs])
    _add_extras(cell, runs, reference_ids)
    return cell


def _add_extras(cell: dict, runs: list[dict], reference_ids: dict | None) -> None:
    """Lookup's guesses (target-only rounds' and those after a round's window), the mean ms per speculative round,
    greedy exactness, where they apply."""
    guessed, rounds = _total(runs, "lookup_guessed") + _total(runs, "round_lookup_guessed"), cell["spec_rounds"]
    if guessed:
        accepted = _total(runs, "lookup_accepted") + _total(runs, "round_lookup_accepted")
        cell["lookup_acceptance"], cell["from_lookup"] = accepted / guessed, _ratio(accepted, cell["new_tokens"])
    if rounds and any("round_s" in r for r in runs):
        cell["profile_ms"] = {**{k: 1000 * _total(runs, f"{k}_s", 0.0) / rounds for k in PROFILE}, "rounds": rounds}
    if reference_ids is not None:     # the share of runs whose greedy tokens equal the reference's
        pairs = [(r["token_ids"], reference_ids[_key(r)]) for r in runs if _key(r) in reference_ids]
        cell["exact_match"] = (sum(a == b for a, b in pairs) / len(pairs)) if pairs else None


def _add_pooled(into: dict, hists: list[dict]) -> None:
    """The histograms of draft sequences per round, added up (none: no key)."""
    pooled = Counter()
    for hist in hists:
        pooled.update(hist)      # keeps zero counts, unlike Counter's +
    if pooled:
        into["sequences_hist"] = dict(sorted(pooled.items(), key=lambda kv: int(kv[0])))


def _average(cells: list[dict]) -> dict:
    avg: dict = {key: sum(c.get(key, 0) for c in cells) for key in SUMMED}
    avg["gamma"] = cells[0].get("gamma")
    for key in AVERAGED:
        values = [c[key] for c in cells if c.get(key) is not None]
        avg[key] = mean(values) if values else None
    _add_pooled(avg, [c.get("sequences_hist", {}) for c in cells])
    profiles = [c["profile_ms"] for c in cells if "profile_ms" in c]
    if profiles:
        rounds = sum(p["rounds"] for p in profiles)
        avg["profile_ms"] = {k: sum(p[k] * p["rounds"] for p in profiles) / rounds for k in PROFILE}
        avg["profile_ms"]["rounds"] = rounds
    return avg


def _ratio(value, base):
    return None if value is None or not base else value / base


# ---- llama.cpp's C++ rows (results.json "llama_cpp") ---------------------------------

def summarize(runs: list[dict], categories: list[str]) -> dict:
    """Per C++ row: pooled decode tok/s per category and their mean."""
    done = [r for r in runs if "error" not in r]
    return {method: _pooled([r for r in done if r["method"] == method], categories)
            for method in dict.fromkeys(r["method"] for r in done)}


def _pooled(runs: list[dict], categories: list[str]) -> dict:
    cells = _by_category(runs, categories, _cpp_cell)
    rates = [c["decode_tokens_per_s"] for c in cells.values() if c["decode_tokens_per_s"]]
    accepted = [c["acceptance_rate"] for c in cells.values() if c["acceptance_rate"] is not None]
    drafted = [c["drafted"] for c in cells.values() if c["drafted"] is not None]
    cells["average"] = {"decode_tokens_per_s": mean(rates) if rates else None,
                        "acceptance_rate": mean(accepted) if accepted else None,
                        "drafted": sum(drafted) if drafted else None,
                        "prompts": sum(c["prompts"] for c in cells.values())}
    return cells


def _cpp_cell(runs: list[dict]) -> dict:
    tokens, seconds, drafted = _total(runs, "new_tokens"), _total(runs, "decode_s"), _total(runs, "drafted")
    return {"prompts": len(runs), "new_tokens": tokens, "decode_s": seconds,
            "decode_tokens_per_s": tokens / seconds if seconds > 0 else None,
            "drafted": drafted if "drafted" in runs[0] else None,
            "acceptance_rate": _total(runs, "accepted") / drafted if drafted else None}


def versus(doc: dict, reference: str = CPP_PEER) -> dict | None:
    """{decoding: {method: {category: ratio, "average": mean}}}: decode tok/s over the C++ `reference`
    row's at the same prompts; None when that row did not run."""
    ref = summarize((doc.get("llama_cpp") or {}).get("runs", []), doc["settings"]["categories"]).get(reference)
    if not ref:
        return None
    out: dict = {}
    for decoding, by_method in doc["results"].items():
        for method, cells in by_method.items():
            ratios = {c: cell["decode_tokens_per_s"] / base for c, cell in cells.items() if c != "average"
                      and cell.get("decode_tokens_per_s") and (base := ref.get(c, {}).get("decode_tokens_per_s"))}
            out.setdefault(decoding, {})[method] = {**ratios, "average": mean(ratios.values())} if ratios else {}
    return out
