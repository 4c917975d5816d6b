"""The target's /metrics (Prometheus text), scraped into the run's counters table.

Every sample becomes a counter row of scope `target`, named as Prometheus writes the series:
`vllm:num_requests_waiting{engine=0}`, `vllm:time_to_first_token_seconds_bucket{engine=0,le=0.5}`.
Histogram buckets are kept (percentiles are estimated from them: analyzers/server_metrics.py),
and so is every label that separates series (vLLM's `engine` with data-parallel engines)
except `model_name`, which names the one model served. `_created` timestamps are dropped.
Info metrics (`vllm:cache_config_info`: value 1, the facts in the labels) are also kept whole
in `info` (not in the counters: their labels are the facts, the value is always 1), so
the run's manifest can say what the server says of itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

DROPPED_LABELS = frozenset({"model_name"})


def series_name(name: str, labels: dict[str, str]) -> str:
    """`name{k=v,…}` with the labels sorted (no quotes: the counters table's convention)."""
    kept = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in DROPPED_LABELS)
    return f"{name}{{{kept}}}" if kept else name


def parse_exposition(text: str) -> tuple[list[tuple[str, float]], dict[str, dict[str, str]]]:
    """Prometheus text → ([(series name, value)], {info metric: its labels}).
    Text that does not parse gives what parsed before the error."""
    from prometheus_client.parser import text_string_to_metric_families

    samples: list[tuple[str, float]] = []
    info: dict[str, dict[str, str]] = {}
    with contextlib.suppress(ValueError, TypeError):
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                if family.type == "info" or s.name.endswith("_info"):
                    info[s.name] = dict(s.labels)  # facts, not a measure: the manifest's
                    continue
                samples.append((series_name(s.name, s.labels), float(s.value)))
    return samples, info


class MetricsScraper:
    """Scrapes `url` every `period_s` into `append((name, ts_ns, value, "target"))` until
    cancelled; a 404 stops it (the server has no metrics), a failed scrape is skipped."""

    def __init__(self, session, url: str, append: Callable, period_s: float,
                 headers: dict | None = None):  # fmt: skip
        self.session, self.url, self.append = session, url, append
        self.period_s, self.headers = period_s, headers or {}
        self.info: dict[str, dict[str, str]] = {}
        self.scrapes = 0

    async def scrape_once(self) -> bool:
        """One scrape; False when the server has no /metrics."""
        t0 = time.monotonic_ns()
        try:
            async with self.session.get(self.url, headers=self.headers) as resp:
                if resp.status == 404:
                    return False
                text = await resp.text() if resp.status == 200 else ""
        except Exception:  # a scrape that fails never fails the run
            return True
        ts = (t0 + time.monotonic_ns()) // 2  # the reply's values hold about mid-request
        samples, info = parse_exposition(text)
        self.info.update(info)
        for name, value in samples:
            self.append((name, ts, value, "target"))
        self.scrapes += bool(samples)
        return True

    async def run(self, first_after: float = 0.0) -> None:
        """Scrape every period until cancelled; the first after `first_after` seconds."""
        await asyncio.sleep(first_after)
        while await self.scrape_once():
            await asyncio.sleep(self.period_s)
