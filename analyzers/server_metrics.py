"""What a server said of itself: its scraped /metrics (counters of scope `target`) over the
run's measured requests, under one vocabulary for vLLM, SGLang and llama.cpp.

The scraper (probes/metrics_scrape.py) stores each series as `name{labels}` per scrape.
Here every concept perfdiag reads (queue time, prefill time, preemptions, prefix hits, …)
maps to the names each server uses for it; the first name a run has wins, and the series
of one concept are summed over their labels (vLLM's data-parallel `engine`s), or filtered
(`reason=capacity`).

- Counters and histograms are deltas between the last scrape at or before the first
  measured request was sent and the first scrape after the last measured request ended,
  so warm-up traffic sent earlier and requests after the run are not counted.
- A histogram's percentile is estimated as Prometheus' `histogram_quantile` does (linear
  within the bucket that holds it); the bucket's bounds are its resolution, and every
  figure taken from a histogram carries them.
- Gauges (running, waiting, KV usage) are read per scrape inside that window.

Where a server does not export a concept, it is absent: checks then say "not evaluated",
never zero.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..traces.reader import Run

# concept → ((series name, {label: value} it must have), …), first match wins.
HISTOGRAMS: dict[str, tuple[tuple[str, dict], ...]] = {
    "queue_s": (("vllm:request_queue_time_seconds", {}), ("sglang:queue_time_seconds", {})),
    "prefill_s": (("vllm:request_prefill_time_seconds", {}),),
    "decode_s": (("vllm:request_decode_time_seconds", {}),),
    "inference_s": (("vllm:request_inference_time_seconds", {}),),
    "ttft_s": (
        ("vllm:time_to_first_token_seconds", {}),
        ("sglang:time_to_first_token_seconds", {}),
    ),
    "itl_s": (
        ("vllm:inter_token_latency_seconds", {}),
        ("vllm:time_per_output_token_seconds", {}),
        ("sglang:inter_token_latency_seconds", {}),
    ),
    "tpot_s": (("vllm:request_time_per_output_token_seconds", {}),),
    "e2e_s": (("vllm:e2e_request_latency_seconds", {}), ("sglang:e2e_request_latency_seconds", {})),
    "iteration_tokens": (("vllm:iteration_tokens_total", {}),),
    "request_prompt_tokens": (("vllm:request_prompt_tokens", {}),),
    "request_preemptions": (("vllm:request_num_preemptions", {}),),
}
COUNTERS: dict[str, tuple[tuple[str, dict], ...]] = {
    "preemptions": (("vllm:num_preemptions_total", {}), ("sglang:num_retracted_reqs_total", {})),
    "prefix_queries": (("vllm:prefix_cache_queries_total", {}),),
    "prefix_hits": (("vllm:prefix_cache_hits_total", {}),),
    # vLLM's KV offloading connector (a host tier): the external prefix cache's tokens,
    # bytes and seconds of loads (host -> device) and stores; 0.32's flat names first,
    # then its deprecated ones labelled by transfer_type (analyzers/kv_offload.py).
    "external_prefix_queries": (("vllm:external_prefix_cache_queries_total", {}),),
    "external_prefix_hits": (("vllm:external_prefix_cache_hits_total", {}),),
    "offload_load_bytes": (
        ("vllm:kv_offload_load_bytes_total", {}),
        ("vllm:kv_offload_total_bytes_total", {"transfer_type": "CPU_to_GPU"}),
    ),
    "offload_load_s": (
        ("vllm:kv_offload_load_time_total", {}),
        ("vllm:kv_offload_total_time_total", {"transfer_type": "CPU_to_GPU"}),
    ),
    "offload_store_bytes": (
        ("vllm:kv_offload_store_bytes_total", {}),
        ("vllm:kv_offload_total_bytes_total", {"transfer_type": "GPU_to_CPU"}),
    ),
    "offload_store_s": (
        ("vllm:kv_offload_store_time_total", {}),
        ("vllm:kv_offload_total_time_total", {"transfer_type": "GPU_to_CPU"}),
    ),
    "prompt_tokens": (
        ("vllm:prompt_tokens_total", {}),
        ("sglang:prompt_tokens_total", {}),
        ("llamacpp:prompt_tokens_total", {}),
    ),
    "prompt_tokens_cached": (
        ("vllm:prompt_tokens_cached_total", {}),
        ("sglang:cached_tokens_total", {}),
    ),
    "generation_tokens": (
        ("vllm:generation_tokens_total", {}),
        ("sglang:generation_tokens_total", {}),
        ("llamacpp:tokens_predicted_total", {}),
    ),
    "requests_finished": (("vllm:request_success_total", {}), ("sglang:num_requests_total", {})),
    "requests_aborted": (("vllm:request_success_total", {"finished_reason": "abort"}),),
    "spec_drafts": (("vllm:spec_decode_num_drafts_total", {}),),
    "spec_draft_tokens": (("vllm:spec_decode_num_draft_tokens_total", {}),),
    "spec_accepted_tokens": (("vllm:spec_decode_num_accepted_tokens_total", {}),),
    "flops": (("vllm:estimated_flops_per_gpu_total", {}),),
    "read_bytes": (("vllm:estimated_read_bytes_per_gpu_total", {}),),
}
GAUGES: dict[str, tuple[tuple[str, dict], ...]] = {
    "running": (
        ("vllm:num_requests_running", {}),
        ("sglang:num_running_reqs", {}),
        ("llamacpp:requests_processing", {}),
    ),
    "waiting": (
        ("vllm:num_requests_waiting", {}),
        ("sglang:num_queue_reqs", {}),
        ("llamacpp:requests_deferred", {}),
    ),
    "waiting_capacity": (("vllm:num_requests_waiting_by_reason", {"reason": "capacity"}),),
    "waiting_deferred": (("vllm:num_requests_waiting_by_reason", {"reason": "deferred"}),),
    "kv_usage": (
        ("vllm:kv_cache_usage_perc", {}),
        ("vllm:gpu_cache_usage_perc", {}),
        ("sglang:token_usage", {}),
        ("llamacpp:kv_cache_usage_ratio", {}),
    ),
    "max_running": (("sglang:max_running_requests", {}),),  # SGLang states its cap
}
# concept → ((series name, the label whose values it is kept apart by), …): counters read
# per label value (summed over the other labels), first name a run has wins.
LABELLED: dict[str, tuple[tuple[str, str], ...]] = {
    "spec_accepted_by_position": (
        ("vllm:spec_decode_num_accepted_tokens_per_pos_total", "position"),
    ),
}
SERVER_PREFIXES = {"vllm:": "vllm", "sglang:": "sglang", "llamacpp:": "llamacpp"}

_SERIES = re.compile(r"^([^{]+)(?:\{(.*)\})?$")


def split_series(series: str) -> tuple[str, dict[str, str]]:
    """`name{a=1,b=x}` → ("name", {"a": "1", "b": "x"})."""
    m = _SERIES.match(series)
    if m is None:
        return series, {}
    labels = {}
    for part in (m.group(2) or "").split(","):
        key, sep, value = part.partition("=")
        if sep:
            labels[key] = value
    return m.group(1), labels


@dataclass(frozen=True)
class Histogram:
    """One histogram's observations between two scrapes."""

    name: str  # the server's series name
    count: float
    sum: float
    bounds: tuple[float, ...]  # bucket upper bounds, ascending, the last +inf
    cumulative: tuple[float, ...]  # observations ≤ each bound

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count > 0 else float("nan")

    def quantile(self, q: float) -> tuple[float, float, float]:
        """(estimate, bucket low, bucket high): linear within the bucket holding rank q·n,
        as Prometheus' histogram_quantile; in the +Inf bucket the estimate is its low bound."""
        if self.count <= 0 or not self.bounds:
            return (float("nan"),) * 3
        rank = q * self.count
        lo_bound, lo_count = 0.0, 0.0
        for bound, cum in zip(self.bounds, self.cumulative, strict=True):
            if cum >= rank and cum > lo_count:
                if math.isinf(bound):
                    return lo_bound, lo_bound, bound
                frac = (rank - lo_count) / (cum - lo_count)
                return lo_bound + frac * (bound - lo_bound), lo_bound, bound
            lo_bound, lo_count = bound, cum
        return lo_bound, lo_bound, float("inf")


@dataclass(frozen=True)
class ServerMetrics:
    server: str  # vllm | sglang | llamacpp | unknown
    start_ns: int  # the scrapes the deltas are taken between
    end_ns: int
    scrapes: int  # scrapes inside the window
    counters: dict[str, float]  # concept → delta
    histograms: dict[str, Histogram]
    gauges: pd.DataFrame  # ts_ns (index) × concept: summed over series, per scrape
    names: dict[str, str] = field(default_factory=dict)  # concept → the series name used
    # concept → {label value: delta} (LABELLED), e.g. accepted draft tokens per position
    by_label: dict[str, dict[str, float]] = field(default_factory=dict)

    def gauge(self, concept: str) -> pd.Series | None:
        return self.gauges.get(concept, None)

    def source(self, *concepts: str) -> str:
        """ "server metrics (name, …)": where a figure came from, for a finding's evidence."""
        used = [self.names[c] for c in concepts if c in self.names]
        return f"server metrics ({', '.join(used)})" if used else "server metrics"


def target_counters(run: Run) -> pd.DataFrame:
    c = run.counters
    if not len(c):
        return c
    return c[(c["scope"] == "target").to_numpy()]


def server_metrics(run: Run, start_ns: int, end_ns: int) -> ServerMetrics | None:
    """The server's own record between the scrapes around [start_ns, end_ns] (the run's
    monotonic clock); None when the run scraped nothing from the server."""
    c = target_counters(run)
    if not len(c):
        return None
    names = c["name"].astype(str).to_numpy()
    ts = c["ts_ns"].to_numpy(np.int64)
    values = c["value"].to_numpy(np.float64)
    scrape_ts = np.unique(ts)
    before = scrape_ts[scrape_ts <= start_ns]
    after = scrape_ts[scrape_ts >= end_ns]
    t0 = int(before[-1]) if len(before) else int(scrape_ts[0])
    t1 = int(after[0]) if len(after) else int(scrape_ts[-1])
    split = {s: split_series(s) for s in np.unique(names)}
    at0, at1 = _values_at(names, ts, values, t0), _values_at(names, ts, values, t1)
    delta = {s: at1.get(s, 0.0) - at0.get(s, 0.0) for s in at1}  # a reset reads negative
    used: dict[str, str] = {}
    counters = {}
    for concept, choices in COUNTERS.items():
        got = _sum_matching(delta, split, choices)
        if got is not None:
            counters[concept], used[concept] = got
    by_label = {}
    for concept, choices in LABELLED.items():
        got = _per_label(delta, split, choices)
        if got is not None:
            by_label[concept], used[concept] = got
    histograms = {}
    for concept, choices in HISTOGRAMS.items():
        h = _histogram(delta, split, choices)
        if h is not None:
            histograms[concept], used[concept] = h, h.name
    inside = (ts >= t0) & (ts <= t1)
    gauges = _gauges(names[inside], ts[inside], values[inside], split, used)
    prefixes = {SERVER_PREFIXES[p] for s in split for p in SERVER_PREFIXES if s.startswith(p)}
    server = next(iter(prefixes)) if len(prefixes) == 1 else "unknown"
    n_scrapes = int(((scrape_ts >= t0) & (scrape_ts <= t1)).sum())
    return ServerMetrics(server, t0, t1, n_scrapes, counters, histograms, gauges, used, by_label)


def _values_at(names, ts, values, t: int) -> dict[str, float]:
    sel = ts == t
    return dict(zip(names[sel].tolist(), values[sel].tolist(), strict=True))


def _matches(labels: dict, want: dict) -> bool:
    return all(labels.get(k) == v for k, v in want.items())


def _sum_matching(delta, split, choices) -> tuple[float, str] | None:
    for name, want in choices:
        hits = [v for s, v in delta.items() if split[s][0] == name and _matches(split[s][1], want)]
        if hits:
            return float(sum(hits)), name
    return None


def _per_label(delta, split, choices) -> tuple[dict[str, float], str] | None:
    for name, label in choices:
        out: dict[str, float] = {}
        for s, v in delta.items():
            base, labels = split[s]
            if base == name and label in labels:
                out[labels[label]] = out.get(labels[label], 0.0) + v
        if out:
            return out, name
    return None


def _histogram(delta, split, choices) -> Histogram | None:
    for name, want in choices:
        buckets: dict[float, float] = {}
        total = count = None
        for s, v in delta.items():
            base, labels = split[s]
            if not _matches(labels, want):
                continue
            if base == f"{name}_bucket" and "le" in labels:
                le = float(labels["le"])  # "+Inf" parses as inf
                buckets[le] = buckets.get(le, 0.0) + v
            elif base == f"{name}_sum":
                total = (total or 0.0) + v
            elif base == f"{name}_count":
                count = (count or 0.0) + v
        if count is not None and total is not None:
            bounds = tuple(sorted(buckets))
            return Histogram(name, count, total, bounds, tuple(buckets[b] for b in bounds))
    return None


def _gauges(names, ts, values, split, used: dict) -> pd.DataFrame:
    columns = {}
    uniques, code = np.unique(names, return_inverse=True)
    for concept, choices in GAUGES.items():
        for name, want in choices:
            wanted = np.array([split[s][0] == name and _matches(split[s][1], want)
                               for s in uniques.tolist()], bool)  # fmt: skip
            sel = wanted[code] if len(uniques) else np.zeros(0, bool)
            if sel.any():
                columns[concept] = pd.Series(values[sel]).groupby(ts[sel]).sum()
                used[concept] = name
                break
    frame = pd.DataFrame(columns)
    frame.index.name = "ts_ns"
    return frame
