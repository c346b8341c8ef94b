"""Prometheus metrics with vLLM's meanings, under the `lantern:` prefix.

Gauges and token counters are read from the engine's snapshot at scrape time; latency histograms
are observed by the request handlers as tokens stream out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80)
_ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
_E2E_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)


class _EngineCollector:
    def __init__(self, snapshot: Callable[[], dict], model: str, alive: Callable[[], bool] | None = None):
        self.snapshot = snapshot
        self.model = model
        self.alive = alive

    def collect(self):
        s = self.snapshot()
        labels = ["model_name"]

        def gauge(name, doc, value):
            g = GaugeMetricFamily(f"lantern:{name}", doc, labels=labels)
            g.add_metric([self.model], value)
            return g

        def counter(name, doc, value):
            c = CounterMetricFamily(f"lantern:{name}", doc, labels=labels)
            c.add_metric([self.model], value)
            return c

        yield gauge("num_requests_running", "Sequences in the running batch.", s["num_running"])
        yield gauge("num_requests_waiting", "Sequences waiting to be scheduled.", s["num_waiting"])
        yield gauge("kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).", s["kv_usage"])
        yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", s["prefix_cache_queries"])
        yield counter("prefix_cache_hits", "Prompt tokens served from the prefix cache.", s["prefix_cache_hits"])
        yield counter("num_preemptions", "Sequences preempted for lack of KV blocks.", s["num_preemptions"])
        yield counter("prompt_tokens", "Prompt tokens prefilled.", s["prompt_tokens"])
        yield counter("generation_tokens", "Tokens generated.", s["generation_tokens"])
        yield counter(
            "request_failure", "Requests the engine failed (the others kept running).", s.get("requests_failed", 0)
        )
        if self.alive is not None:
            yield gauge(
                "engine_alive",
                "1 while the engine loop runs; 0 once it has stopped (see /health).",
                1.0 if self.alive() else 0.0,
            )


class ServerMetrics:
    def __init__(self, snapshot: Callable[[], dict], model: str, alive: Callable[[], bool] | None = None):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(snapshot, model, alive))
        self.model = model
        kw: dict[str, Any] = {"labelnames": ["model_name"], "registry": self.registry}
        self.ttft = Histogram(
            "lantern:time_to_first_token_seconds", "Arrival to first token.", buckets=_TTFT_BUCKETS, **kw
        ).labels(model)
        self.itl = Histogram(
            "lantern:inter_token_latency_seconds", "Time between streamed tokens.", buckets=_ITL_BUCKETS, **kw
        ).labels(model)
        self.e2e = Histogram(
            "lantern:e2e_request_latency_seconds", "Arrival to finish.", buckets=_E2E_BUCKETS, **kw
        ).labels(model)
        self.requests = Counter(
            "lantern:request_success",
            "Finished requests by reason.",
            labelnames=["model_name", "finished_reason"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
