"""Consistency checks on a results document: the numbers must add up, whatever the timings.

CI runs these on a one-prompt smoke run, where timings mean nothing but every
count must still agree: the tokens a run returned, the tokens it reported,
the pooled totals, the acceptance counts. An empty list means consistent.
"""
from __future__ import annotations

import math

from hetspec.benchmarks.bench.metrics import aggregate

RESULT_KEYS = ("tokens_per_s", "speedup", "ttft_rel", "acceptance_rate", "mean_accepted_per_round")


def check_results(doc: dict) -> list[str]:
    problems: list[str] = []
    methods = doc["settings"]["methods"]
    categories = doc["settings"]["categories"]
    decodings = list(doc["settings"]["decodings"])
    for run in doc["runs"]:
        problems += [f"{_where(run)}: {p}" for p in _check_run(run)]
    for decoding in decodings:
        by_method = doc["results"].get(decoding, {})
        for method in methods:
            cells = by_method.get(method, {})
            for category in [*categories, "average"]:
                cell = cells.get(category)
                where = f"results[{decoding}][{method}][{category}]"
                if cell is None:
                    problems.append(f"{where}: missing")
                    continue
                problems += [f"{where}: {p}" for p in _check_cell(cell, method, doc)]
            runs = [r for r in doc["runs"] if r["decoding"] == decoding and r["method"] == method and "error" not in r]
            pooled = sum(r["new_tokens"] for r in runs)
            if cells.get("average") and cells["average"]["new_tokens"] != pooled:
                problems.append(f"results[{decoding}][{method}]: {cells['average']['new_tokens']} tokens in the "
                                f"average, {pooled} in the runs")
    fresh = aggregate(doc)
    if _rounded(fresh) != _rounded(doc["results"]):
        problems.append("results differ from a fresh aggregation of the runs")
    if not isinstance(doc.get("chosen_gamma"), int) or doc["chosen_gamma"] < 1:
        problems.append(f"chosen_gamma is {doc.get('chosen_gamma')!r}")
    return problems


def _check_run(run: dict) -> list[str]:
    if "error" in run:
        return [f"failed: {run['error']}"]
    out = []
    n, limit = run["new_tokens"], run["max_new_tokens"]
    if n != len(run["token_ids"]):
        out.append(f"reports {n} new tokens but returned {len(run['token_ids'])}")
    if not 0 < n <= limit:
        out.append(f"{n} new tokens, expected 1..{limit}")
    if run["finish_reason"] == "length" and n != limit:
        out.append(f"finished by length after {n} of {limit} tokens")
    if run["finish_reason"] not in ("length", "eos", "stop"):
        out.append(f"finish reason {run['finish_reason']!r}")
    if not run["total_s"] > 0 or not 0 < run["ttft_s"] <= run["total_s"] + 1e-6:
        out.append(f"times: ttft {run['ttft_s']}, total {run['total_s']}")
    drafted, accepted = run.get("drafted", 0), run.get("accepted", 0)
    if not 0 <= accepted <= drafted:
        out.append(f"accepted {accepted} of {drafted} drafted")
    spec, committed = run.get("spec_rounds", 0), run.get("committed_in_spec_rounds", 0)
    if spec and not spec <= committed <= n:
        out.append(f"{committed} tokens committed in {spec} speculative rounds of a {n}-token run")
    reported = run.get("engine_committed_in_spec_rounds", committed)
    # each round commits its accepted draft tokens plus one target token, except a last
    # round cut short by EOS, a stop string or the token limit
    if spec and not accepted + spec - 1 <= reported <= accepted + spec and run["method"] != "pld":
        out.append(f"committed {reported} != accepted {accepted} + one target token per round ({spec})")
    hist = run.get("sequences_hist")
    # Rounds whose pending window already reaches the token limit draft nothing: each
    # commits a token at least, so there are at most a window's worth (gamma + 1) of them.
    if hist and not spec - 1 - (run.get("gamma") or 1) <= sum(hist.values()) <= spec:
        out.append(f"sequence histogram counts {sum(hist.values())} rounds, {spec} speculative rounds ran")
    for key in ("draft_s", "verify_s", "round_s", "overhead_s"):
        if key in run and run[key] < 0:
            out.append(f"{key} is negative")
    return out


def engine_stat_warnings(doc: dict) -> list[str]:
    """Where the engine's own statistics disagree with the tokens it returned.

    The suite's figures do not depend on these (tokens per round is counted
    from the tokens themselves), so they are warnings, not failed checks; each
    names the run so the engine can be fixed."""
    out = []
    for run in doc["runs"]:
        if "error" in run or "engine_committed_in_spec_rounds" not in run or not run.get("spec_rounds"):
            continue
        reported, committed = run["engine_committed_in_spec_rounds"], run["committed_in_spec_rounds"]
        if reported != committed:
            out.append(f"{_where(run)}: the engine's stats count {reported} tokens committed in {run['spec_rounds']} "
                       f"speculative rounds, the run committed {committed} there (new tokens - 1 - target-only "
                       f"rounds; finish: {run['finish_reason']})")
    return out


def _check_cell(cell: dict, method: str, doc: dict) -> list[str]:
    out = []
    for key in RESULT_KEYS:
        if key not in cell:
            out.append(f"no {key}")
    value = cell.get("tokens_per_s")
    if not (isinstance(value, float) and value > 0 and math.isfinite(value)):
        out.append(f"tokens_per_s = {value!r}")
    for key in ("speedup", "ttft_rel"):
        if cell.get(key) is not None and not cell[key] > 0:
            out.append(f"{key} = {cell[key]!r}")
    if method == "vanilla" and cell.get("speedup") is not None and abs(cell["speedup"] - 1) > 1e-9:
        out.append(f"vanilla's speedup is {cell['speedup']}")
    rate = cell.get("acceptance_rate")
    if rate is not None and not 0 <= rate <= 1:
        out.append(f"acceptance_rate = {rate}")
    per_round = cell.get("mean_accepted_per_round")
    info = doc["methods"].get(method, {})
    gamma = None if info.get("rebalanced") else info.get("gamma") or cell.get("gamma")   # rebalanced: no cap
    if per_round is not None and not (1 <= per_round <= (gamma or per_round) + 1 + 1e-9):
        out.append(f"mean_accepted_per_round = {per_round} (gamma {gamma})")
    return out


def _where(run: dict) -> str:
    return f"{run['method']} on {run['category']}/{run['question_id']} ({run['decoding']})"


def _rounded(value):
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value
