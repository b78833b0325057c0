"""From per-run records to the figures the paper reports, per category and on average.

Per category, rates are pooled (total tokens / total seconds), as Spec-Bench
does, so a long prompt weighs by its tokens, not by its count. The "average"
column is the mean of the per-category figures (each category counts once,
like the paper's "Avg."); its histograms and time profiles are pooled over
every round instead. Speedup and relative TTFT divide by vanilla's figure for
the same category and decoding; vs_target by the engine's own target-only
figure, which separates the speculative gain from the target's kernels; vs_llama
by llama.cpp's on every core (the peer a CPU user would run instead). Greedy
output is compared with vanilla's, or, for a llama.cpp target (which computes the
GGUF file's own blocks, not transformers' float32), with the engine's target-only
output. Figures that do not apply (acceptance of a method that never drafts) are
None, never 0.
"""
from __future__ import annotations

from statistics import mean

from hetspec.benchmarks.bench.methods import PEER
from hetspec.ipc.specs import GGUF_TARGET_BACKENDS


def aggregate(doc: dict) -> dict:
    runs = [r for r in doc["runs"] if "error" not in r]
    methods = doc["settings"]["methods"]
    categories = doc["settings"]["categories"]
    reference = "target" if doc["settings"].get("target_backend") in GGUF_TARGET_BACKENDS else "vanilla"
    reference_ids = {(r["decoding"], r["category"], r["question_id"]): r["token_ids"]
                     for r in runs if r["method"] == reference}
    results: dict = {}
    for decoding in doc["settings"]["decodings"]:
        by_method: dict = {}
        for method in methods:
            cells = {}
            for category in categories:
                chosen = [r for r in runs if r["decoding"] == decoding and r["method"] == method
                          and r["category"] == category]
                if chosen:
                    cells[category] = _cell(chosen, reference_ids if decoding == "greedy" else None)
            by_method[method] = cells
        vanilla, alone, peer = by_method.get("vanilla", {}), by_method.get("target", {}), by_method.get(PEER, {})
        for method, cells in by_method.items():
            for category, cell in cells.items():
                base, target, llama = vanilla.get(category), alone.get(category), peer.get(category)
                cell["speedup"] = _ratio(cell["tokens_per_s"], base and base["tokens_per_s"])
                cell["vs_target"] = _ratio(cell["tokens_per_s"], target and target["tokens_per_s"])
                cell["vs_llama"] = _ratio(cell["tokens_per_s"], llama and llama["tokens_per_s"])
                cell["ttft_rel"] = _ratio(cell["ttft_s"], base and base["ttft_s"])
            if cells:
                cells["average"] = _average(list(cells.values()))
        results[decoding] = by_method
    return results


def _cell(runs: list[dict], reference_ids: dict | None) -> dict:
    tokens = sum(r["new_tokens"] for r in runs)
    seconds = sum(r["total_s"] for r in runs)
    decode_tokens = sum(max(0, r["new_tokens"] - 1) for r in runs)
    decode_s = sum(max(0.0, r["total_s"] - r["ttft_s"]) for r in runs)
    drafted = sum(r.get("drafted", 0) for r in runs)
    spec_rounds = sum(r.get("spec_rounds", 0) for r in runs)
    speculative = any(r.get("spec_rounds") or r.get("gamma") for r in runs)
    cell = {
        "prompts": len(runs),
        "new_tokens": tokens,
        "total_s": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "decode_tokens_per_s": decode_tokens / decode_s if decode_s > 0 else None,
        "ttft_s": mean(r["ttft_s"] for r in runs),
        "acceptance_rate": (sum(r.get("accepted", 0) for r in runs) / drafted) if drafted else
        (0.0 if speculative else None),
        "mean_accepted_per_round": (sum(r.get("committed_in_spec_rounds", 0) for r in runs) / spec_rounds)
        if spec_rounds else None,
        "spec_rounds": spec_rounds,
        "rested": sum(r.get("rested", 0) for r in runs),
        "gamma": runs[0].get("gamma"),
    }
    guessed = sum(r.get("lookup_guessed", 0) for r in runs)
    if guessed:       # target-only rounds' prompt-lookup guesses (scheduler/decoding/lookup.py)
        accepted = sum(r.get("lookup_accepted", 0) for r in runs)
        cell["lookup_acceptance"], cell["from_lookup"] = accepted / guessed, accepted / tokens if tokens else None
    hist: dict[str, int] = {}
    for r in runs:
        for k, v in (r.get("sequences_hist") or {}).items():
            hist[k] = hist.get(k, 0) + v
    if hist:
        cell["sequences_hist"] = dict(sorted(hist.items(), key=lambda kv: int(kv[0])))
    if any("round_s" in r for r in runs) and spec_rounds:
        cell["profile_ms"] = _profile(runs, spec_rounds)
    if reference_ids is not None:
        pairs = [(r["token_ids"], reference_ids.get((r["decoding"], r["category"], r["question_id"]))) for r in runs]
        pairs = [(a, b) for a, b in pairs if b is not None]
        cell["exact_match"] = (sum(a == b for a, b in pairs) / len(pairs)) if pairs else None
    return cell


def _profile(runs: list[dict], spec_rounds: int) -> dict:
    """Mean milliseconds per speculative round: each side's compute, the round's wall
    time, and what is left of it once the busy side is subtracted (orchestration)."""
    total = {k: sum(r.get(k, 0.0) for r in runs) for k in ("draft_s", "verify_s", "round_s", "overhead_s")}
    return {"draft": 1000 * total["draft_s"] / spec_rounds, "verify": 1000 * total["verify_s"] / spec_rounds,
            "round": 1000 * total["round_s"] / spec_rounds, "overhead": 1000 * total["overhead_s"] / spec_rounds,
            "rounds": spec_rounds}


def _average(cells: list[dict]) -> dict:
    avg: dict = {"prompts": sum(c["prompts"] for c in cells), "new_tokens": sum(c["new_tokens"] for c in cells),
                 "total_s": sum(c["total_s"] for c in cells), "spec_rounds": sum(c["spec_rounds"] for c in cells),
                 "rested": sum(c.get("rested", 0) for c in cells),
                 "gamma": cells[0].get("gamma")}
    for key in ("tokens_per_s", "decode_tokens_per_s", "ttft_s", "speedup", "vs_target", "vs_llama", "ttft_rel",
                "acceptance_rate", "lookup_acceptance", "from_lookup",
                "mean_accepted_per_round", "exact_match"):
        values = [c[key] for c in cells if c.get(key) is not None]
        avg[key] = mean(values) if values else None
    hist: dict[str, int] = {}
    for c in cells:
        for k, v in c.get("sequences_hist", {}).items():
            hist[k] = hist.get(k, 0) + v
    if hist:
        avg["sequences_hist"] = dict(sorted(hist.items(), key=lambda kv: int(kv[0])))
    profiles = [c["profile_ms"] for c in cells if "profile_ms" in c]
    if profiles:
        rounds = sum(p["rounds"] for p in profiles)
        avg["profile_ms"] = {k: sum(p[k] * p["rounds"] for p in profiles) / rounds
                             for k in ("draft", "verify", "round", "overhead")}
        avg["profile_ms"]["rounds"] = rounds
    return avg


def _ratio(value, base):
    if value is None or not base:
        return None
    return value / base
