"""Prometheus metrics of an HTTP-served engine, under vLLM's names.

Dashboards and load tools (vllm bench serve, guidellm, Grafana boards made for
vLLM) read vLLM's metric names, so the standard ones are exported under those
names, with the model_name label vLLM puts on them; what only hetspec has is
under hetspec:. Speculative decoding, as vLLM defines it: a draft is one
verified window, its tokens are the draft tokens, and accepted_tokens_per_pos
counts, for each window position, the drafts accepted up to and past it.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)


class Metrics:
    def __init__(self, model: str):
        self.model = model
        self.registry = r = CollectorRegistry()
        label = ["model_name"]
        self.requests = Counter("vllm:request_success", "Finished requests, by finish reason",
                                [*label, "finished_reason"], registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens processed", label, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated", label, registry=r)
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Draft windows verified", label, registry=r)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens verified", label, registry=r)
        self.accepted_tokens = Counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted", label,
                                       registry=r)
        self.accepted_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                        "Drafts whose token at this position was accepted", [*label, "position"],
                                        registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token", label,
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("vllm:time_per_output_token_seconds", "Time per output token after the first", label,
                              buckets=TPOT_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end request latency", label,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.running = Gauge("vllm:num_requests_running", "Requests being decoded", label, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests queued in the engine", label, registry=r)
        self.batch = Gauge("hetspec:batch_size", "Requests in the last step of several at once (one target pass)",
                           label, registry=r)
        self.restarts = Gauge("hetspec:worker_restarts", "Worker restarts since the engine started",
                              [*label, "worker"], registry=r)
        self.scheduler_restarts = Gauge("hetspec:scheduler_restarts", "Scheduler restarts since the engine started",
                                        label, registry=r)

    def observe(self, result, e2e_s: float, ttft_s: float | None) -> None:
        """Count one finished request from its Result (its stats are the engine's own)."""
        s, m = result.stats, self.model
        self.requests.labels(m, result.finish_reason).inc()
        self.prompt_tokens.labels(m).inc(int(s.get("prompt_tokens", 0)))
        self.generation_tokens.labels(m).inc(len(result.token_ids))
        self.drafts.labels(m).inc(int(s.get("drafts", 0)))
        self.draft_tokens.labels(m).inc(int(s.get("drafted", 0)))
        self.accepted_tokens.labels(m).inc(int(s.get("accepted", 0)))
        for position, count in enumerate(s.get("accepted_per_pos", [])):
            self.accepted_per_pos.labels(m, str(position)).inc(count)
        self.e2e.labels(m).observe(e2e_s)
        if ttft_s is not None:
            self.ttft.labels(m).observe(ttft_s)
            if len(result.token_ids) > 1:
                self.tpot.labels(m).observe((e2e_s - ttft_s) / (len(result.token_ids) - 1))

    def exposition(self, info: dict | None) -> bytes:
        """The text format, with the gauges read from the engine's live info (None: engine unreachable)."""
        if info is not None:
            self.running.labels(self.model).set(info.get("running", 0))
            self.waiting.labels(self.model).set(info.get("waiting", 0))
            self.batch.labels(self.model).set(info.get("batch", 0))
            for worker, count in info.get("restarts", {"draft": 0, "target": 0}).items():
                self.restarts.labels(self.model, worker).set(count)
            self.scheduler_restarts.labels(self.model).set(info.get("scheduler", {}).get("restarts", 0))
        return generate_latest(self.registry)
