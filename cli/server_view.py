"""`perfdiag analyze RUN --details` on a run against a server: what the server said of itself
over the run (its /metrics, analyzers/server_metrics.py), as a table beside the client's."""

from __future__ import annotations

import math

from rich.table import Table

from .app import out
from .fit import fit

_HISTOGRAMS = (
    ("queue_s", "queue"), ("prefill_s", "prefill"), ("decode_s", "decode"),
    ("inference_s", "inference (prefill + decode)"), ("ttft_s", "TTFT (in the server)"),
    ("itl_s", "ITL"), ("tpot_s", "TPOT"), ("e2e_s", "E2E (in the server)"),
)  # fmt: skip
_COUNTERS = (
    ("requests_finished", "requests finished"), ("preemptions", "preemptions"),
    ("prompt_tokens", "prompt tokens"), ("prompt_tokens_cached", "prompt tokens from its cache"),
    ("prefix_queries", "prefix-cache queries (tokens)"),
    ("prefix_hits", "prefix-cache hits (tokens)"),
    ("generation_tokens", "generated tokens"), ("spec_draft_tokens", "drafted tokens"),
    ("spec_accepted_tokens", "accepted draft tokens"),
)  # fmt: skip
_GAUGES = (
    ("running", "requests running"), ("waiting", "requests waiting"),
    ("waiting_capacity", "waiting for capacity"), ("kv_usage", "KV cache usage"),
)  # fmt: skip


def _seconds(est: float, lo: float, hi: float) -> str:
    if not math.isfinite(est):
        return "—"
    top = "∞" if math.isinf(hi) else f"{hi * 1e3:,.0f}"
    return f"{est * 1e3:,.1f} ({lo * 1e3:,.0f}–{top})"


def print_server_record(ctx) -> None:
    """The server's histograms, counters and gauges over the run; nothing for a run that
    scraped no server."""
    from ..playbooks.facts import Unavailable
    from ..playbooks.facts_target import server_record

    rec = server_record(ctx)
    if isinstance(rec, Unavailable):
        return
    sm = rec[0]
    span = (sm.end_ns - sm.start_ns) / 1e9
    t = Table("histogram", "count", "mean ms", "p50 ms (bucket)", "p99 ms (bucket)",
              title=f"the server's own record ({sm.server} /metrics: {sm.scrapes} scrapes over "
              f"{span:.1f} s; percentiles interpolated within their bucket)")  # fmt: skip
    for key, label in _HISTOGRAMS:
        h = sm.histograms.get(key)
        if h is not None and h.count > 0:
            t.add_row(label, f"{h.count:,.0f}", f"{h.mean * 1e3:,.1f}",
                      _seconds(*h.quantile(0.5)), _seconds(*h.quantile(0.99)))  # fmt: skip
    out.print(fit(t, out))
    c = Table("counter", "over the run", "gauge", "mean", "peak")
    counters = [(label, f"{sm.counters[k]:,.0f}") for k, label in _COUNTERS if k in sm.counters]
    gauges = []
    for key, label in _GAUGES:
        g = sm.gauge(key)
        if g is not None and len(g):
            pct = key == "kv_usage"
            gauges.append((label, f"{g.mean():.0%}" if pct else f"{g.mean():.1f}",
                           f"{g.max():.0%}" if pct else f"{g.max():.0f}"))  # fmt: skip
    for i in range(max(len(counters), len(gauges))):
        left = counters[i] if i < len(counters) else ("", "")
        right = gauges[i] if i < len(gauges) else ("", "", "")
        c.add_row(*left, *right)
    out.print(fit(c, out))
