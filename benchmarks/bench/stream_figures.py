"""The figures of streamed requests (benchmarks/README.md, "Many clients at once"): a request's
tokens per chunk, time to first token, decode rate and inter-token gaps, and a pass of N requests
at once against the same requests served alone.
"""
from __future__ import annotations

import itertools

import numpy as np


def chunk_counts(texts: list[str], total: int, count) -> list[int]:
    """Tokens in each chunk: the growth of the text's token count (re-tokenized), never negative, the
    last chunk bringing the sum to `total` (the server's usage)."""
    counts, before, text = [], 0, ""
    for i, piece in enumerate(texts):
        text += piece
        now = total if i == len(texts) - 1 else min(total, count(text))
        counts.append(max(0, now - before))
        before = max(before, now)
    return counts


def request_figures(record: dict, count) -> dict:
    """One request: its tokens, time to first token, decode rate after the first chunk, inter-token gaps."""
    if record["error"]:
        raise RuntimeError(f"request {record['prompt']} failed: {record['error']}")
    usage = record["usage"] or {}
    total = int(usage.get("completion_tokens") or count(record["text"]))
    times = [at - record["sent"] for at, _ in record["chunks"]]
    counts = chunk_counts([text for _, text in record["chunks"]], total, count)
    out = {"prompt": record["prompt"], "tokens": total, "prompt_tokens": usage.get("prompt_tokens"),
           "total_s": record["done"] - record["sent"], **_timing(times, counts, total),
           "chunks": [[round(t, 5), k] for t, k in zip(times, counts)], "finish_reason": record["finish_reason"],
           "text": record["text"]}
    if record["timings"]:                      # llama-server's own
        out["predicted_per_second"] = record["timings"].get("predicted_per_second")
        out["timings"] = record["timings"]
    if record["hetspec"]:
        out["hetspec"] = record["hetspec"]
    return out


def _timing(times: list[float], counts: list[int], total: int) -> dict:
    """TTFT, the decode rate after the first chunk, and the gaps: a chunk of k tokens after g, k gaps of g/k."""
    arrived = [(t, k) for t, k in zip(times, counts) if k > 0]
    if not arrived:
        return {"ttft_s": None, "decode_tokens_per_s": None, "gaps_s": []}
    gaps = [(t - before) / k for (before, _), (t, k) in itertools.pairwise(arrived) for _ in range(k)]
    after, span = total - arrived[0][1], arrived[-1][0] - arrived[0][0]
    return {"ttft_s": arrived[0][0], "decode_tokens_per_s": after / span if after and span > 0 else None,
            "gaps_s": gaps}


def summarize(requests: list[dict], alone: dict, wall_s: float) -> dict:
    """A pass of N requests at once against the same requests served alone."""
    tokens, solo = sum(r["tokens"] for r in requests), [alone[r["prompt"]] for r in requests]
    sequential = sum(s["tokens"] for s in solo) / sum(s["total_s"] for s in solo)
    ttfts = [r["ttft_s"] for r in requests if r["ttft_s"] is not None]
    differ = [r["prompt"] for r, s in zip(requests, solo) if r["text"] != s["text"]]
    predicted = all(r.get("predicted_per_second") for r in requests + solo)
    return {"n": len(requests), "tokens": tokens, "wall_s": wall_s, "aggregate_tokens_per_s": tokens / wall_s,
            "summed_decode_tokens_per_s": sum(r["decode_tokens_per_s"] or 0 for r in requests),
            "sequential_tokens_per_s": sequential, "vs_sequential": tokens / wall_s / sequential,
            "ttft_mean_s": float(np.mean(ttfts)) if ttfts else None, "ttft_max_s": max(ttfts, default=None),
            "equal_alone": len(requests) - len(differ), "differ": differ,
            **_latencies(requests, "", predicted), **_latencies(solo, "alone_", predicted)}


def _latencies(requests: list[dict], prefix: str, predicted: bool) -> dict:
    """ITL p50 and p99 over every gap (numpy's linear percentiles); where every request has llama-server's own
    decode rate, their sum."""
    gaps = [g for r in requests for g in r["gaps_s"]]
    out = {f"{prefix}itl_p{q}_ms": float(np.percentile(gaps, q)) * 1000 if gaps else None for q in (50, 99)}
    if predicted:
        out[f"{prefix}summed_predicted_per_second"] = sum(r["predicted_per_second"] for r in requests)
    return out
