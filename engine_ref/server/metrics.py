"""/metrics in Prometheus text format, under vLLM's names where the meaning is the same.

So dashboards and scrapers built for vLLM read engine_ref unchanged. Where our definition
differs in detail it says so in the help text. Each server has its own registry (tests run
several servers in one process). Gauges are read when scraped, from live state, so an idle
server never reports the last busy step's numbers.

| name | type | meaning |
|---|---|---|
| vllm:num_requests_running / _waiting | gauge | in the engine: admitted / not (yet, or again) |
| vllm:kv_cache_usage_perc | gauge | referenced KV blocks / pool (0–1) |
| vllm:prefix_cache_queries / _hits | counter | prompt tokens looked up / found, at admission |
| vllm:num_preemptions | counter | preemptions |
| vllm:prompt_tokens / vllm:generation_tokens | counter | prompt tokens computed / tokens sampled |
| vllm:request_success | counter | finished requests by finished_reason |
| vllm:request_queue_time_seconds | histogram | queued → first admitted by the scheduler |
| vllm:time_to_first_token_seconds | histogram | HTTP request received → first token written |
| vllm:inter_token_latency_seconds | histogram | between a request's consecutive sampled tokens |
| vllm:e2e_request_latency_seconds | histogram | HTTP request received → last token written |
| perfdiag:requests_rejected | counter | refused before the engine, by reason |
| perfdiag:requests_aborted | counter | aborted in the engine: client disconnect, timeout |
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily

# vLLM's buckets, so histograms from the two servers can be compared bucket by bucket.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    def __init__(self, model_name: str, live_state) -> None:
        """`live_state()` returns (running, waiting, kv_usage_fraction) at scrape time."""
        disable_created_metrics()  # process-wide, as vLLM does: `_created` samples are noise
        self.registry = r = CollectorRegistry(auto_describe=True)
        label = ["model_name"]

        def counter(name, doc, extra=()):
            return Counter(name, doc, [*label, *extra], registry=r)

        def hist(name, doc, buckets):
            return Histogram(name, doc, label, buckets=buckets, registry=r).labels(model_name)

        self.model = model_name
        self.queue_time = hist(
            "vllm:request_queue_time_seconds",
            "Queued to first admitted by the scheduler.",
            REQUEST_BUCKETS,
        )
        self.ttft = hist(
            "vllm:time_to_first_token_seconds",
            "HTTP request received to its first token written.",
            TTFT_BUCKETS,
        )
        self.itl = hist(
            "vllm:inter_token_latency_seconds",
            "Between a request's consecutive sampled tokens.",
            ITL_BUCKETS,
        )
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "HTTP request received to its last token written.",
            REQUEST_BUCKETS,
        )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in prompt tokens looked up at first admission.",
        ).labels(model_name)
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in cached prompt tokens at first admission.",
        ).labels(model_name)
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemptions."
        ).labels(model_name)
        self.prompt_tokens = counter("vllm:prompt_tokens",
                                     "Prompt tokens computed (recomputation included)."
                                     ).labels(model_name)  # fmt: skip
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens sampled.").labels(
            model_name
        )
        self._success = counter("vllm:request_success", "Finished requests by reason.",
                                ["finished_reason"])  # fmt: skip
        self._rejected = counter(
            "perfdiag:requests_rejected",
            "Requests refused before the engine, by reason.",
            ["reason"],
        )
        self._aborted = counter(
            "perfdiag:requests_aborted", "Requests aborted in the engine, by reason.", ["reason"]
        )
        r.register(_LiveGauges(model_name, live_state))

    def success(self, reason: str) -> None:
        self._success.labels(self.model, reason).inc()

    def rejected(self, reason: str) -> None:
        self._rejected.labels(self.model, reason).inc()

    def aborted(self, reason: str) -> None:
        self._aborted.labels(self.model, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _LiveGauges:
    def __init__(self, model_name: str, live_state) -> None:
        self.model, self.live_state = model_name, live_state

    def describe(self):
        return []  # collected at scrape time only

    def collect(self):
        running, waiting, kv = self.live_state()
        for name, doc, value in (
            ("vllm:num_requests_running", "Requests admitted by the scheduler.", running),
            ("vllm:num_requests_waiting", "Requests waiting for admission.", waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv),
        ):
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric([self.model], value)
            yield g
