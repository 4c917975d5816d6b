"""The load client's health per shard of a distributed run, and the run's verdict from them.

Each shard's LoopMonitor judges its own event loop (lag, CPU: probes/http_session.py); the
driver adds how late the shard's sends were against the schedule (created − scheduled_send
per request, from the shard's own events: one clock, so no alignment error in it). The
merged `client_health` keeps the single-client keys (worst shard's figures, `client_bound`
when any shard was) so everything that reads it today reads a sharded run too, with the
reasons naming the shard, and `shards` holding each one's figures.
"""

from __future__ import annotations

import numpy as np

# A shard whose sends were this late at p99 fell behind its schedule: an order of
# magnitude above an idle client's (p99 ~1-2 ms at 300 req/s on two cores, BENCHMARKS.md)
# and half the loop-lag p99 that calls a client bound (http_session.LAG_P99_S).
LATE_P99_S = 0.01


def send_lateness(due_ns, created_ns) -> dict:
    """Lateness of sends against their schedule (open loop; empty for a closed loop)."""
    late = np.asarray(created_ns, np.int64) - np.asarray(due_ns, np.int64)
    if not len(late):
        return {"sends": 0}
    return {
        "sends": len(late),
        "send_lateness_p50_ms": float(np.percentile(late, 50)) / 1e6,
        "send_lateness_p99_ms": float(np.percentile(late, 99)) / 1e6,
        "send_lateness_max_ms": float(late.max()) / 1e6,
    }


def shard_verdict(shard: int, monitor: dict | None, lateness: dict) -> dict:
    """One shard's health: its loop monitor's summary, its lateness, and why it is bound."""
    health = dict(monitor or {})
    reasons = [f"shard {shard}: {r}" for r in health.get("reasons", [])]
    p99 = lateness.get("send_lateness_p99_ms")
    if p99 is not None and p99 >= LATE_P99_S * 1e3:
        reasons.append(f"shard {shard}: sends p99 {p99:.1f} ms behind schedule")
    health.update(lateness)
    health["reasons"] = reasons
    health["client_bound"] = bool(reasons)
    return health


def merged_health(shards: dict[int, dict], missing: list[int]) -> dict:
    """The run's client_health from its shards' (worst figures, every reason)."""
    present = list(shards.values())

    def worst(key: str, pick=max):
        values = [h[key] for h in present if isinstance(h.get(key), int | float)]
        return pick(values) if values else None

    reasons = [r for h in present for r in h.get("reasons", [])]
    behind = sorted(k for k, h in shards.items() if h.get("client_bound"))
    return {
        "loop_lag_p50_ms": worst("loop_lag_p50_ms"),
        "loop_lag_p99_ms": worst("loop_lag_p99_ms"),
        "loop_lag_max_ms": worst("loop_lag_max_ms"),
        "loop_cpu_pct_mean": worst("loop_cpu_pct_mean"),
        "loop_cpu_pct_max": worst("loop_cpu_pct_max"),
        "host_steal_pct": worst("host_steal_pct"),
        "send_lateness_p99_ms": worst("send_lateness_p99_ms"),
        "client_bound": bool(reasons),
        "busy": any(h.get("busy") for h in present),
        "reasons": reasons,
        "shards_behind": behind,
        "shards_missing": sorted(missing),  # said by the run's status and notes, not here
        "shards": {str(k): h for k, h in sorted(shards.items())},
    }
