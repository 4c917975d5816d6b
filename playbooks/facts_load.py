"""Facts of step 2: does the load arrive as asked, and does the engine keep up with it?"""

from __future__ import annotations

import numpy as np

from .facts import Fact, Param, TriageContext, Unavailable, ev, fact, finite, ms, worst

UNCAPPED_WAIT_S = 10e-3  # a run that does not say how it was driven: waits above this count


def _arrival(ctx: TriageContext) -> dict:
    arrival = (ctx.run_options.get("workload") or {}).get("arrival")
    return arrival if isinstance(arrival, dict) else {}


@fact(
    "back_pressure",
    provides=(
        "cap",
        "target_rps",
        "offered_rps",
        "offered_pct",
        "blocked_pct",
        "wait_p50_ms",
        "wait_p99_ms",
        "total_wait_s",
        "needed",
    ),
)
def back_pressure(ctx: TriageContext) -> Fact | Unavailable:
    """Share of requests that were due but found the client's concurrency cap full, so
    they waited before being sent and the offered rate fell below the target."""
    load, m = ctx.get("load"), ctx.get("metrics")
    if load is None:
        return ctx.missing("load")
    bp, o = load.back_pressure, load.offered
    if bp.concurrency_cap is not None:
        value = bp.blocked_share
    elif o.mode is None:  # not said how it was driven: judge by the waits
        value = bp.waited_share if bp.client_wait_s.p50 > UNCAPPED_WAIT_S else 0.0
    else:
        value = 0.0  # no cap: nothing is held back
    # What the target needs: Little's law with the time a request spends once sent.
    w = m.e2e_s.mean if m is not None else float("nan")
    needed = o.target_rate_rps * w if o.target_rate_rps and finite(w) else float("nan")
    shortfall = 1.0 - o.offered_vs_target if finite(o.offered_vs_target) else value
    per_request = ctx.serving.metrics.per_request if m is not None else None
    evidence = (
        ev("cap", "concurrency cap", bp.concurrency_cap),
        ev("target_rps", "target rate", o.target_rate_rps, "req/s"),
        ev("offered_rps", "offered rate", o.offered_rate_rps, "req/s"),
        ev("offered_pct", "offered / target", o.offered_vs_target, "%"),
        ev("blocked_pct", "requests held back", value, "%"),
        ev("wait_p50_ms", "client wait p50", ms(bp.client_wait_s.p50), "ms"),
        ev("wait_p99_ms", "client wait p99", ms(bp.client_wait_s.p99), "ms"),
        ev("total_wait_s", "total client wait", bp.total_wait_s, "s"),
        ev("needed", "in flight the target needs (rate × time in system)", needed),
    )
    ids = (
        () if per_request is None else (worst(per_request, "client_wait_s", "longest client wait"),)
    )
    return Fact(float(value), evidence, ids, impact=float(np.clip(shortfall, 0.0, 1.0)))


@fact("client_behind_schedule", provides=("planned_rps", "offered_rps", "late_pct", "late_p99_ms"))
def client_behind_schedule(ctx: TriageContext) -> Fact | Unavailable:
    """How far the client's offered rate fell below its own plan (1 − offered / planned):
    the load generator itself could not keep up (open loop only)."""
    load = ctx.get("load")
    if load is None:
        return ctx.missing("load")
    o = load.offered
    if not finite(o.planned_rate_rps) or o.planned_rate_rps <= 0:
        return Unavailable("no send schedule (a closed loop, or no scheduled_send events)")
    value = max(0.0, 1.0 - o.offered_rate_rps / o.planned_rate_rps)
    evidence = (
        ev("planned_rps", "planned rate", o.planned_rate_rps, "req/s"),
        ev("offered_rps", "offered rate", o.offered_rate_rps, "req/s"),
        ev("late_pct", "sent > 1 ms late", o.late_share, "%"),
        ev("late_p99_ms", "lateness p99", ms(o.lateness_s.p99), "ms"),
    )
    per_request = ctx.serving.metrics.per_request if ctx.get("metrics") is not None else None
    ids = () if per_request is None else (worst(per_request, "lateness_s", "sent latest"),)
    return Fact(value, evidence, ids, impact=value)


@fact(
    "wait_growth",
    provides=(
        "arrival_rps",
        "completion_rps",
        "ttft_first_ms",
        "ttft_last_ms",
        "excess_pct",
        "mean_waiting",
        "sent",
    ),
    min_requests=Param(int, 8),
)
def wait_growth(ctx: TriageContext, min_requests: int) -> Fact | Unavailable:
    """How fast the time to first token grows with send time, in seconds per second of
    sending: 0 when the engine keeps up; above 0 the queue grows without bound, and
    arrivals exceed what the engine completes by about that fraction (λ/μ ≈ 1 + growth).
    Robust: the median TTFT of the last third of sends against the first third."""
    m = ctx.get("metrics")
    if m is None:
        return ctx.missing("metrics")
    if _arrival(ctx).get("mode") == "closed":
        return Unavailable(
            "a closed loop sends only when a request ends: it cannot outrun the engine"
        )
    pr = m.per_request
    sent = pr["sent_ns"].to_numpy("float64", na_value=np.nan)
    ttft = pr["ttft_s"].to_numpy("float64")
    ok = np.isfinite(sent) & np.isfinite(ttft) & ~pr["is_warmup"].to_numpy(bool)
    if ok.sum() < min_requests:
        return Unavailable(f"fewer than {min_requests} measured requests with a first token")
    t, y = (sent[ok] - np.nanmin(sent)) / 1e9, ttft[ok]
    order = np.argsort(t)
    t, y = t[order], y[order]
    third = len(t) // 3
    first, last = slice(0, third), slice(len(t) - third, len(t))
    dt = float(np.median(t[last]) - np.median(t[first]))
    if dt <= 0:
        return Unavailable("every request was sent at once: no growth to measure")
    growth = float(max(0.0, (np.median(y[last]) - np.median(y[first])) / dt))
    span = float(t[-1] - t[0])
    arrival_rps = (len(t) - 1) / span if span > 0 else float("nan")
    done = pr["sent_ns"].to_numpy("float64", na_value=np.nan) + pr["e2e_s"].to_numpy() * 1e9
    done_in = (done - np.nanmin(sent)) / 1e9
    completion_rps = (
        float(np.sum((done_in >= t[0]) & (done_in <= t[-1])) / span) if span > 0 else np.nan
    )
    sat = ctx.get("load").saturation if ctx.get("load") is not None else None
    evidence = (
        ev("arrival_rps", "arrival rate (measured requests)", arrival_rps, "req/s"),
        ev("completion_rps", "completion rate while sending", completion_rps, "req/s"),
        ev("ttft_first_ms", "median TTFT, first third of sends", ms(np.median(y[first])), "ms"),
        ev("ttft_last_ms", "median TTFT, last third of sends", ms(np.median(y[last])), "ms"),
        ev(
            "excess_pct",
            "arrivals beyond capacity (≈ growth / (1 + growth))",
            growth / (1 + growth),
            "%",
        ),
        ev("mean_waiting", "mean engine waiting queue", sat.mean_waiting if sat else None),
        ev("sent", "measured requests", int(ok.sum())),
    )
    ids = (worst(pr[ok], "ttft_s", "longest TTFT"),)
    return Fact(growth, evidence, ids, impact=growth / (1 + growth))


@fact("littles_law_gap", provides=("client_l", "lambda_w", "engine_l"))
def littles_law_gap(ctx: TriageContext) -> Fact | Unavailable:
    """|λ·W − L| / L over the window: Little's law fails when the system is not stable or
    the run's boundaries disagree (requests counted on one side only)."""
    load = ctx.get("load")
    if load is None:
        return ctx.missing("load")
    ll = load.littles_law
    if not finite(ll.lambda_w_vs_client):
        return Unavailable("no requests in flight in the window")
    evidence = (
        ev("client_l", "L (client, time-weighted)", ll.client_in_flight),
        ev("lambda_w", "λ·W", ll.lambda_w),
        ev("engine_l", "L (engine)", ll.engine_in_system),
    )
    return Fact(ll.lambda_w_vs_client, evidence, impact=min(1.0, ll.lambda_w_vs_client))
