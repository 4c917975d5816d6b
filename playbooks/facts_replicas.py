"""Facts of step 4 for data-parallel runs (`perfdiag run --dp N`): how unevenly the router
spread the work over the replicas and what that cost (analyzers/replicas.py). Runs of one
engine are not evaluated."""

from __future__ import annotations

import numpy as np

from ..analyzers import replicas
from ..analyzers.actions import Setting, run_action
from .facts import Fact, TriageContext, Unavailable, ev, fact

_NONE = "the run has one engine (perfdiag run --dp N records replicas)"
BALANCED_ROUTER = "least-loaded"
PAID = 1.1  # the overloaded replica's latency over the others' that makes it critical


def _analysis(ctx: TriageContext):
    if "replicas" not in ctx.memo:
        ctx.memo["replicas"] = replicas.analyze_replicas(ctx.run)
    return ctx.memo["replicas"]


@fact(
    "dp_imbalance",
    provides=("replicas", "router", "overloaded", "idlest", "imbalance", "overloaded_share",
              "excess_s", "lost_s", "span_s", "queue_excess_ms", "ttft_excess_ms", "balanced",
              "per_replica", "advice", "scattered", "groups", "prefix_lost"),
)  # fmt: skip
def dp_imbalance(ctx: TriageContext) -> Fact | Unavailable:
    """Share of the run the replica with the most work spent on work beyond an even
    share (its busy time × (1 − mean load / its load), over the run's step span): time
    a balanced router would have spread over the other replicas."""
    a = _analysis(ctx)
    if a is None:
        return Unavailable(_NONE)
    per = a.per_replica.set_index("replica")
    over = per.loc[a.busiest]
    rows = "; ".join(
        f"{r}: {row.requests:.0f} requests, {row.load_share:.0%} of the tokens, busy "
        f"{row.busy_share:.0%}, queue {row.queue_mean_s * 1e3:.1f} ms"
        for r, row in per.iterrows()
    )
    router = a.router or "unknown"
    action = None
    advice = "The router already balances load: look at what slows the busiest replica."
    if router != BALANCED_ROUTER:
        # TTFT p90: the overloaded replica's requests are the slow tenth (and more); its
        # p50 sits where the two replicas' latencies meet, so it moves less surely
        action = run_action(
            "ttft.p90",
            Setting("engine.router", router, BALANCED_ROUTER),
            expect=f"max/mean load {a.balanced_imbalance:.2f} instead of {a.imbalance:.2f}",
        )
        advice = (
            f"Route by load: --router {BALANCED_ROUTER} (now {router}) would have given this "
            f"workload a max/mean load of {a.balanced_imbalance:.2f} instead of "
            f"{a.imbalance:.2f}; with shared prefixes, --router prefix-aware keeps each "
            "group on one replica and still falls back to the least-loaded one."
        )
    evidence = (
        ev("replicas", "replicas", a.replicas),
        ev("router", "router", router),
        ev("overloaded", "replica with the most work", a.busiest),
        ev("idlest", "replica with the least work", a.idlest),
        ev("imbalance", "max / mean load (tokens routed)", a.imbalance),
        ev("overloaded_share", "of the tokens on it", float(over.load_share), "%"),
        ev("excess_s", "its busy time beyond an even share", a.excess_s, "s"),
        ev("lost_s", "replica time idle while another queued", a.lost_s, "s"),
        ev("span_s", "run's step span", a.span_s, "s"),
        ev("queue_excess_ms", "its extra queue time (mean)", a.queue_excess_s * 1e3, "ms"),
        ev("ttft_excess_ms", "its extra TTFT (p50)", a.ttft_excess_s * 1e3, "ms"),
        ev("balanced", "max / mean with a least-loaded router", a.balanced_imbalance),
        ev("per_replica", "per replica", rows),
        ev("advice", "advice", advice),
        ev("scattered", "prefix groups split across replicas", a.scattered_groups),
        ev("groups", "prefix groups", a.prefix_groups),
        ev("prefix_lost", "prefix tokens recomputed by the split", a.prefix_tokens_lost),
    )
    # Critical only if the overloaded replica's users paid for it: its TTFT or ITL (p50)
    # at least PAID above the other replicas'. Otherwise the skew is capacity held idle.
    others = per.drop(index=a.busiest)
    paid = any(
        float(over[col]) > PAID * float(others[col].median())
        for col in ("ttft_p50_s", "itl_p50_s")
        if np.isfinite(over[col]) and np.isfinite(others[col].median())
    )
    return Fact(a.excess_share, evidence, impact=min(1.0, a.excess_share),
                max_severity=None if paid else "warning", action=action)  # fmt: skip
