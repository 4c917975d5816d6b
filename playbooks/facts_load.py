"""Facts of step 2: does the load arrive as asked, and does the engine keep up with it?"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..analyzers.actions import Setting, run_action
from ..analyzers.replicas import replicas_of
from .advice import NO_ADVICE, seq_cap_advice
from .facts import (
    Fact,
    Param,
    TriageContext,
    Unavailable,
    arrival_spec,
    ev,
    fact,
    finite,
    impact_evidence,
    ms,
    share,
    ttft_impact,
    worst,
)

UNCAPPED_WAIT_S = 10e-3  # a run that does not say how it was driven: waits above this count


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
        "cap_advice",
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
    action, text = None, ""
    if bp.concurrency_cap is not None and finite(needed) and needed > 0:
        # In flight at a Poisson rate is about Poisson(needed): a cap at its 99th
        # percentile (needed + 2.33 √needed) holds back about 1 % of requests.
        cap_to = math.ceil(needed + 2.33 * math.sqrt(needed))
        if cap_to > bp.concurrency_cap:
            text = (
                f"Set --concurrency {cap_to} (now {bp.concurrency_cap}): the target needs "
                f"about {needed:.1f} requests in flight, and a cap at {cap_to} holds back "
                "about 1 % of them."
            )
            action = run_action(
                "due_e2e.p50",
                Setting("workload.concurrency", bp.concurrency_cap, cap_to),
                expect="the client wait gone; the engine sees the target rate",
            )
    evidence += (ev("cap_advice", "advice", text),)
    ids = (
        () if per_request is None else (worst(per_request, "client_wait_s", "longest client wait"),)
    )
    impact = float(np.clip(shortfall, 0.0, 1.0))
    return Fact(float(value), evidence, ids, impact=impact, action=action)


@fact(
    "client_behind_schedule",
    provides=("planned_rps", "issued_rps", "offered_rps", "late_pct", "late_p99_ms"),
)
def client_behind_schedule(ctx: TriageContext) -> Fact | Unavailable:
    """How far the rate the client issued requests at fell below its own plan
    (1 − issued / planned): the load generator itself could not keep up (open loop only).
    Issued is when a request was due and created, before any concurrency cap held it:
    a full cap is back-pressure (client-back-pressure), not a late client."""
    load = ctx.get("load")
    if load is None:
        return ctx.missing("load")
    o = load.offered
    if not finite(o.planned_rate_rps) or o.planned_rate_rps <= 0:
        return Unavailable("no send schedule (a closed loop, or no scheduled_send events)")
    value = max(0.0, 1.0 - o.issued_rate_rps / o.planned_rate_rps)
    evidence = (
        ev("planned_rps", "planned rate", o.planned_rate_rps, "req/s"),
        ev("issued_rps", "issued rate (before a cap)", o.issued_rate_rps, "req/s"),
        ev("offered_rps", "offered rate (sent)", o.offered_rate_rps, "req/s"),
        ev("late_pct", "sent > 1 ms late", o.late_share, "%"),
        ev("late_p99_ms", "lateness p99", ms(o.lateness_s.p99), "ms"),
    )
    per_request = ctx.serving.metrics.per_request if ctx.get("metrics") is not None else None
    ids = () if per_request is None else (worst(per_request, "lateness_s", "sent latest"),)
    return Fact(value, evidence, ids, impact=value)


@fact("sent_below_plan", provides=("planned_rps", "offered_rps"))
def sent_below_plan(ctx: TriageContext) -> Fact | Unavailable:
    """How far the rate requests were actually sent at fell below the client's plan
    (1 − sent / planned, open loop only), for whatever reason: the client was late, or a
    concurrency cap held requests until the engine finished others. The symptom of low
    throughput; client-back-pressure and client-behind-schedule say which."""
    load = ctx.get("load")
    if load is None:
        return ctx.missing("load")
    o = load.offered
    if not finite(o.planned_rate_rps) or o.planned_rate_rps <= 0:
        return Unavailable("no send schedule (a closed loop, or no scheduled_send events)")
    value = max(0.0, 1.0 - o.offered_rate_rps / o.planned_rate_rps)
    evidence = (
        ev("planned_rps", "planned rate", o.planned_rate_rps, "req/s"),
        ev("offered_rps", "offered rate (sent)", o.offered_rate_rps, "req/s"),
    )
    return Fact(value, evidence, (), impact=value)


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
        "capacity_advice",
    ),
    min_requests=Param(int, 8),
)
def wait_growth(ctx: TriageContext, min_requests: int) -> Fact | Unavailable:
    """How fast the time to first token grows with send time, in seconds per second of
    sending: 0 when the engine keeps up; above 0 the queue grows without bound, and
    arrivals exceed what the engine completes by about that fraction (λ/μ ≈ 1 + growth).
    Robust: the median TTFT of the last third of sends against the first third; 0 when
    as many requests completed as arrived while sending (bursts, not overload)."""
    m = ctx.get("metrics")
    if m is None:
        return ctx.missing("metrics")
    if arrival_spec(ctx).get("mode") == "closed":
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
    if not completion_rps < arrival_rps:
        # The engine completed as fast as requests arrived: a TTFT trend is the load's
        # shape (a burst late in the run), not a queue growing without bound.
        growth = 0.0
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
    advice, action = _capacity_advice(ctx, completion_rps) if growth > 0 else NO_ADVICE
    evidence += (ev("capacity_advice", "advice", advice),)
    ids = (worst(pr[ok], "ttft_s", "longest TTFT"),)
    return Fact(growth, evidence, ids, impact=growth / (1 + growth), action=action)


def _capacity_advice(ctx: TriageContext, completion_rps: float):
    """More capacity where the scheduler's own cap is what binds and memory allows it;
    otherwise a rate the engine sustains (80 % of what it completed)."""
    lim = ctx.get("limits")
    if lim is not None and lim.binding == "max_num_seqs":
        text, action = seq_cap_advice(ctx, lim)
        if action is not None:
            return text, action
    rate = arrival_spec(ctx).get("rate")
    if not finite(completion_rps) or completion_rps <= 0 or not rate:
        return NO_ADVICE
    to = round(0.8 * completion_rps, 1)
    text = (
        f"Set --rate {to:g} (now {rate:g}): the engine completed {completion_rps:.1f} req/s "
        "at this configuration, so 80 % of that leaves it headroom; more load needs more "
        "capacity (replicas, a faster engine)."
    )
    setting = Setting("workload.rate", float(rate), to)
    return text, run_action("ttft.p50", setting, expect="a TTFT that no longer grows")


@fact("littles_law_gap", provides=("client_l", "lambda_w", "engine_l", "gap_pct", "edge_pct"))
def littles_law_gap(ctx: TriageContext) -> Fact | Unavailable:
    """|λ·W − L| / L over the window, beyond what the window's edges make in a stable
    system: Little's law fails when the system is not stable or the run's boundaries
    disagree (requests counted on one side only).

    λ counts the requests sent in the window and W their whole time in the system; L
    counts only the time inside it. The requests still in flight at the window's end
    (about L of them, each with at most about W to go) make λ·W − L up to L·W/T on their
    own, so a gap up to W/T is what a window T long shows of a stable system: a closed
    loop of 14 clients sending 2 requests each (T ≈ 2W) reads ~40 % off. Every warning
    of seeds 1000-2001 (36 runs) was within 0.15 of W/T; 9 of them healthy closed loops."""
    load = ctx.get("load")
    if load is None:
        return ctx.missing("load")
    ll = load.littles_law
    if not finite(ll.lambda_w_vs_client):
        return Unavailable("no requests in flight in the window")
    edge = ll.mean_time_in_system_s / ll.window_s if ll.window_s > 0 else float("inf")
    edge = edge if finite(edge) else float("inf")
    value = max(0.0, ll.lambda_w_vs_client - edge)
    evidence = (
        ev("client_l", "L (client, time-weighted)", ll.client_in_flight, "requests"),
        ev("lambda_w", "λ·W", ll.lambda_w, "requests"),
        ev("engine_l", "L (engine)", ll.engine_in_system, "requests"),
        ev("gap_pct", "|λ·W − L| / L", ll.lambda_w_vs_client, "%"),
        ev("edge_pct", "what the window's edges allow (W / window)", edge, "%"),
    )
    return Fact(value, evidence, impact=min(1.0, value))


@fact(
    "burst_queueing",
    provides=("arrival_rps", "completion_rps", "peak_rps", "ca2", "cs2", "ca2_noise",
              "queue_ms", "ttft_ms", "requests", "burst_advice", "mean_gain", "tail_gain",
              "slo_gain"),
)  # fmt: skip
def burst_queueing(ctx: TriageContext) -> Fact | Unavailable:
    """Share of the mean TTFT that is queue wait caused by arrivals burstier than a
    Poisson stream at the same mean rate: load shape, not capacity. Kingman's
    approximation (G/G/1: wait ∝ (ca² + cs²) / 2) splits the queue wait by where its
    variability comes from; the part (ca² − 1) / (ca² + cs²) would be gone with Poisson
    arrivals. 0 unless ca² exceeds 1 by more than twice its sampling noise (≈ 2.8 / √n
    for n Poisson gaps)."""
    m, t = ctx.get("metrics"), ctx.get("ttft")
    if m is None or t is None:
        return ctx.missing("metrics" if m is None else "ttft")
    if arrival_spec(ctx).get("mode") == "closed":
        return Unavailable("a closed loop sends when a request ends: its arrivals have no shape")
    pr = m.per_request
    ok = ~pr["is_warmup"].to_numpy(bool)
    # The load's shape is the schedule the client meant to keep, where it kept one: a
    # client held up (a probe stall, a busy event loop) bunches its sends by itself.
    sent_ns = pr["sent_ns"].to_numpy("float64", na_value=np.nan)
    behind = pr["client_wait_s"].to_numpy("float64", na_value=np.nan)
    behind = behind + pr["lateness_s"].to_numpy("float64", na_value=np.nan)
    due = np.where(np.isfinite(behind), sent_ns - behind * 1e9, sent_ns)
    sent = np.sort(due[ok])
    sent = sent[np.isfinite(sent)] / 1e9
    if len(sent) < 16:
        return Unavailable("fewer than 16 measured requests with a send time")
    gaps = np.diff(sent)
    ca2 = float(gaps.var() / gaps.mean() ** 2) if gaps.mean() > 0 else float("nan")
    noise = 2.8 / math.sqrt(len(gaps))
    parts = t.per_request
    comp = ctx.get("composition")
    step_s = comp.busy_s / comp.steps if comp is not None and comp.steps else 0.0
    # Less the step a request arriving mid-step must wait for (see ttft_part_share).
    queue = np.maximum(parts["queue_s"].to_numpy("float64") - step_s, 0.0)
    # Service: the time a request holds its place in the batch (E2E less its queue).
    by_id = pd.Series(pr["e2e_s"].to_numpy("float64"), index=pr["request_id"].astype(str))
    e2e = by_id.reindex(parts["request_id"].astype(str)).to_numpy("float64")
    service = e2e - parts["queue_s"].to_numpy("float64")
    service = service[np.isfinite(service) & (service > 0)]
    service_time = float(service.mean()) if len(service) else float("nan")
    cs2 = float(service.var() / service_time**2) if len(service) else 0.0
    bursty = finite(ca2) and ca2 > 1.0 + 2 * noise
    from_shape = (ca2 - 1.0) / (ca2 + cs2) if bursty else 0.0
    frame = parts.assign(burst_s=queue * from_shape)
    value = share(float(frame["burst_s"].mean()), t.mean.ttft_s)
    value = value if finite(value) else 0.0
    span = sent[-1] - sent[0]
    window = max(service_time, 1e-3) if finite(service_time) else 1.0
    counts = np.searchsorted(sent, sent + window) - np.arange(len(sent))
    thr = ctx.serving.metrics.throughput.requests_per_s
    impact = ttft_impact(ctx, frame, "burst_s")
    lim = ctx.get("limits")
    arrival_rps = (len(sent) - 1) / span if span > 0 else float("nan")
    load = _slot_load(ctx, lim, arrival_rps, service_time)
    queue_share = share(float(np.mean(queue)), t.mean.ttft_s)
    advice, action = NO_ADVICE
    if value > 0 and lim is not None and lim.binding == "max_num_seqs":
        advice, action = seq_cap_advice(ctx, lim, target="ttft.p90")
    if value > 0 and not advice:
        advice = (
            f"Pace arrivals at the gateway (bursts reached {counts.max() / window:.1f} req/s "
            f"against {thr:.1f} completed per second), or provision for the burst peak, not "
            "the mean."
        )
    evidence = (
        ev("arrival_rps", "mean arrival rate", arrival_rps if finite(arrival_rps) else None,
           "req/s"),
        ev("completion_rps", "completion rate", thr, "req/s"),
        ev("peak_rps", f"peak arrivals over {ms(window):.0f} ms", counts.max() / window, "req/s"),
        ev("ca2", "arrival variability ca² (Poisson: 1)", ca2),
        ev("cs2", "service variability cs²", cs2),
        ev("ca2_noise", "sampling noise of ca²", noise),
        ev("queue_ms", "mean queue wait", ms(float(np.mean(queue))), "ms"),
        # What a loss's share of the queue is judged by (playbooks/evaluate.covers).
        ev("queue_pct", "queue wait's share of TTFT", queue_share, "%"),
        ev("slot_load", "load on the sequence slots (arrivals × service ÷ slots)", load, "%"),
        ev("ttft_ms", "mean TTFT", ms(t.mean.ttft_s), "ms"),
        ev("requests", "measured requests", len(sent)),
        ev("burst_advice", "advice", advice),
        *impact_evidence(impact, "TTFT"),
    )  # fmt: skip
    ids = (worst(frame, "burst_s", "most queue wait from bursts"),)
    return Fact(value, evidence, ids, impact=value, max_severity=impact.max_severity, action=action)


def _slot_load(ctx: TriageContext, lim, arrival_rps: float, service_s: float) -> float:
    """The queue's utilisation ρ where the sequence cap held it: requests hold a slot for
    their service time, so λ · service is the slots in use on average (Little's law), of
    max_num_seqs per replica. The engine's busy share is no ρ for a batching loop: it
    steps while any request runs, at any batch. NaN where another limit held the queue."""
    if lim is None or lim.binding != "max_num_seqs" or not lim.max_num_seqs:
        return float("nan")
    slots = lim.max_num_seqs * max(1, len(replicas_of(ctx.run.steps)))
    load = arrival_rps * service_s / slots
    return float(load) if finite(load) else float("nan")


@fact("schedule_vs_target", provides=("target_rps", "planned_rps", "requests", "noise_pct"))
def schedule_vs_target(ctx: TriageContext) -> Fact | Unavailable:
    """How far the drawn send schedule's rate is from the target rate (|1 − planned /
    target|): a short random schedule offers another load than the one asked for; its
    relative noise is about 1 / √n for n Poisson arrivals."""
    load = ctx.get("load")
    if load is None:
        return ctx.missing("load")
    o = load.offered
    if not finite(o.planned_rate_rps) or not o.target_rate_rps:
        return Unavailable("no target rate and send schedule (a closed loop, or not recorded)")
    n = ctx.get("metrics").outcomes.requests if ctx.get("metrics") is not None else 0
    value = abs(1.0 - o.planned_rate_rps / o.target_rate_rps)
    evidence = (
        ev("target_rps", "target rate", o.target_rate_rps, "req/s"),
        ev("planned_rps", "rate of the drawn schedule", o.planned_rate_rps, "req/s"),
        ev("requests", "requests", n),
        ev("noise_pct", "expected deviation (1 / √n)", 1 / math.sqrt(n) if n else None, "%"),
    )
    return Fact(value, evidence, impact=0.0)
