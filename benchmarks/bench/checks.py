"""Consistency checks on a results document: whatever the timings, every count must agree (tokens
returned and reported, pooled totals, acceptance). An empty list means consistent."""
from __future__ import annotations

import math

RESULT_KEYS = ("tokens_per_s", "speedup", "ttft_rel", "acceptance_rate", "mean_accepted_per_round")


def check_results(doc: dict) -> list[str]:
    problems = [f"{_where(run)}: {p}" for run in doc["runs"] for p in _check_run(run)]
    for decoding in doc["settings"]["decodings"]:
        for method in doc["settings"]["methods"]:
            problems += _check_method(doc, decoding, method)
    if not isinstance(doc.get("chosen_gamma"), int) or doc["chosen_gamma"] < 1:
        problems.append(f"chosen_gamma is {doc.get('chosen_gamma')!r}")
    return problems


def _check_method(doc: dict, decoding: str, method: str) -> list[str]:
    cells, info = doc["results"].get(decoding, {}).get(method, {}), doc["methods"].get(method, {})
    problems = [f"results[{decoding}][{method}][{category}]: {p}" for category in [*doc["settings"]["categories"], "average"]
                for p in (_check_cell(cells[category], method, info) if category in cells else ["missing"])]
    pooled = sum(r["new_tokens"] for r in doc["runs"]
                 if r["decoding"] == decoding and r["method"] == method and "error" not in r)
    if cells.get("average") and cells["average"]["new_tokens"] != pooled:
        problems.append(f"results[{decoding}][{method}]: {cells['average']['new_tokens']} tokens in the "
                        f"average, {pooled} in the runs")
    return problems


def _check_run(run: dict) -> list[str]:
    if "error" in run:
        return [f"failed: {run['error']}"]
    n, limit, returned = run["new_tokens"], run["max_new_tokens"], len(run["token_ids"])
    drafted, accepted = run.get("drafted", 0), run.get("accepted", 0)
    spec, committed = run.get("spec_rounds", 0), run.get("committed_in_spec_rounds", 0)
    reported = run.get("engine_committed_in_spec_rounds", committed)
    hist = run.get("sequences_hist")
    rules = [
        (n != returned, f"reports {n} new tokens but returned {returned}"),
        (not 0 < n <= limit, f"{n} new tokens, expected 1..{limit}"),
        (run["finish_reason"] == "length" and n != limit, f"finished by length after {n} of {limit} tokens"),
        (run["finish_reason"] not in ("length", "eos", "stop"), f"finish reason {run['finish_reason']!r}"),
        (not run["total_s"] > 0 or not 0 < run["ttft_s"] <= run["total_s"] + 1e-6,
         f"times: ttft {run['ttft_s']}, total {run['total_s']}"),
        (not 0 <= accepted <= drafted, f"accepted {accepted} of {drafted} drafted"),
        (spec and not spec <= committed <= n,
         f"{committed} tokens committed in {spec} speculative rounds of a {n}-token run"),
        # each round commits its accepted draft tokens plus one target token, except a last
        # round cut short by EOS, a stop string or the token limit
        (spec and not accepted + spec - 1 <= reported <= accepted + spec,
         f"committed {reported} != accepted {accepted} + one target token per round ({spec})"),
        # Rounds whose pending window already reaches the token limit draft nothing: each
        # commits a token at least, so there are at most a window's worth (gamma + 1) of them.
        (hist and not spec - 1 - (run.get("gamma") or 1) <= sum(hist.values()) <= spec,
         f"sequence histogram counts {sum((hist or {}).values())} rounds, {spec} speculative rounds ran"),
        *[(run.get(key, 0) < 0, f"{key} is negative") for key in ("draft_s", "verify_s", "round_s", "overhead_s")],
    ]
    return [message for broken, message in rules if broken]


def _check_cell(cell: dict, method: str, method_info: dict) -> list[str]:
    value, rate, per_round = cell.get("tokens_per_s"), cell.get("acceptance_rate"), cell.get("mean_accepted_per_round")
    # a rebalanced method's windows pass its starting gamma: no cap then
    gamma = None if method_info.get("rebalanced") else method_info.get("gamma") or cell.get("gamma")
    rules = [
        *[(key not in cell, f"no {key}") for key in RESULT_KEYS],
        (not (isinstance(value, float) and value > 0 and math.isfinite(value)), f"tokens_per_s = {value!r}"),
        *[(cell.get(key) is not None and not cell[key] > 0, f"{key} = {cell.get(key)!r}")
          for key in ("speedup", "ttft_rel")],
        (method == "vanilla" and cell.get("speedup") is not None
         and abs(cell["speedup"] - 1) > 1e-9, f"vanilla's speedup is {cell.get('speedup')}"),
        (rate is not None and not 0 <= rate <= 1, f"acceptance_rate = {rate}"),
        (per_round is not None and not 1 <= per_round <= (gamma or per_round) + 1 + 1e-9,
         f"mean_accepted_per_round = {per_round} (gamma {gamma})"),
    ]
    return [message for broken, message in rules if broken]


def _where(run: dict) -> str:
    return f"{run['method']} on {run['category']}/{run['question_id']} ({run['decoding']})"
