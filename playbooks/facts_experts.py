"""Facts of step 4 for mixture-of-experts runs: how unevenly the router loads the experts,
and what that costs in step time under the run's placement (analyzers/experts.py). Runs
without recorded expert loads are not evaluated."""

from __future__ import annotations

from ..analyzers import experts
from ..analyzers.actions import Setting, run_action
from ..analyzers.roofline import run_device
from .facts import Fact, TriageContext, Unavailable, ev, fact

_NONE = "the run recorded no expert loads (a mixture-of-experts model records them)"


def _ranks_text(where: list[int]) -> str:
    """'rank 0: experts 0-3; rank 1: experts 4-7' (runs of consecutive experts joined)."""
    parts = []
    for r in sorted(set(where)):
        ids = [e for e, x in enumerate(where) if x == r]
        runs, start = [], ids[0]
        for a, b in zip(ids, [*ids[1:], None], strict=True):
            if b != a + 1:
                runs.append(f"{start}" if start == a else f"{start}-{a}")
                start = b
        parts.append(f"rank {r}: experts {', '.join(runs)}")
    return "; ".join(parts)


def _cores_short(s: experts.ExpertSummary, device: str) -> str:
    """On a CPU run, why a new placement may save less than predicted: the busiest rank,
    which hardly waits, still got well under a core per second of its forwards, so the
    machine had no core to spare for the ranks to compute at once ("" otherwise)."""
    cpu = s.rank_cpu_per_s.get(s.hot_rank)
    if device != "cpu" or s.ranks < 2 or cpu is None or cpu >= 0.75:
        return ""
    return (
        f" Caveat: rank {s.hot_rank}, which computed the hot experts and hardly waited, got "
        f"{cpu:.2f} CPU-seconds per second of its forwards: this machine had no core to "
        f"spare (see host-contention), so re-placed experts would share the cores the "
        f"ranks already compete for; the saving holds where every rank has a core or "
        f"device of its own."
    )


def _action(s: experts.ExpertSummary):
    """The balancing placement as a re-run (--expert-placement), when it predicts less
    waiting than the run's own placement."""
    if s.ranks < 2 or s.balanced == s.placement or s.balanced_cost_share >= s.cost_share:
        return None
    now, to = (",".join(str(r) for r in w) for w in (s.placement, s.balanced))
    expect = (
        f"busiest/mean rank {s.balanced_max_mean:.2f}× (now {s.rank_max_mean:.2f}×), "
        f"{s.balanced_cost_share:.1%} of step time lost (now {s.cost_share:.1%})"
    )
    return run_action("e2e.p50", Setting("engine.expert_placement", now, to), expect=expect)


def _advice(s: experts.ExpertSummary) -> str:
    if s.ranks < 2:
        return (
            f"On one rank this costs no waiting: the same {s.routed:,} expert-tokens run in "
            f"fewer, larger GEMMs. Before spreading the experts over ranks, check the "
            f"placement against these loads: split contiguously over 2 ranks they would "
            f"put {s.contiguous2_max_mean:.2f}× the mean on the busier rank."
        )
    if s.replicate is not None:
        return (
            f"Expert {s.replicate} alone gets more than a rank's fair share of the tokens, so "
            f"no placement balances it: replicate it on every rank (split its tokens "
            f"between the copies); predicted busiest/mean rank {s.replicated_max_mean:.2f}× "
            f"(now {s.rank_max_mean:.2f}×). Then place the rest as: {_ranks_text(s.balanced)}."
        )
    return (
        f"Re-place the experts to balance the measured loads: {_ranks_text(s.balanced)}; "
        f"predicted busiest/mean rank {s.balanced_max_mean:.2f}× (now {s.rank_max_mean:.2f}×), "
        f"cost {s.balanced_cost_share:.1%} of step time (now {s.cost_share:.1%}): "
        f"--expert-placement {','.join(str(r) for r in s.balanced)}."
    )


@fact(
    "expert_imbalance",
    provides=("experts", "layers", "ranks", "top_k", "max_mean", "step_max_mean", "hot",
              "hot_layer", "placement", "rank_share", "hot_rank", "hot_rank_pct",
              "rank_max_mean", "us_per_token", "cost_source", "cost_ms", "step_ms", "wait_ms",
              "combine_wait_ms", "rank_cpu", "advice"),
)  # fmt: skip
def expert_imbalance(ctx: TriageContext) -> Fact | Unavailable:
    """Share of step time lost to uneven expert loads: per step and MoE layer, the busiest
    rank's extra expert tokens over the mean rank, priced at the run's own time per token
    per expert (every rank waits for the busiest at the layer's combine). Zero on one rank."""
    if "expert_summary" not in ctx.memo:
        ctx.memo["expert_summary"] = experts.summarize(ctx.run)
    s = ctx.memo["expert_summary"]
    if s is None:
        return Unavailable(_NONE)
    hot = ", ".join(f"expert {e} {share:.0%}" for e, share in s.hot) or "none above 1.5× uniform"
    layer, expert, share = s.hot_layer
    shares = ", ".join(f"rank {r}: {x:.0%}" for r, x in enumerate(s.rank_share))
    waits = ", ".join(f"rank {r}: {w:.0f} ms" for r, w in s.rank_wait_ms.items())
    at_combines = ", ".join(f"rank {r}: {w:.0f} ms" for r, w in s.combine_wait_ms.items())
    per_step = max(s.steps, 1)
    multi = s.ranks > 1  # the rank figures mean something only with several ranks
    evidence = (
        ev("experts", "experts", s.experts),
        ev("layers", "MoE layers", s.layers),
        ev("ranks", "ranks holding experts", s.ranks),
        ev("top_k", "experts per token", s.top_k),
        ev("max_mean", "busiest expert / mean, over the run (per layer)", s.max_mean, "×"),
        ev("step_max_mean", "busiest expert / mean, per step and layer", s.step_max_mean, "×"),
        ev("hot", "hot experts (share of routed tokens)", hot),
        ev("hot_layer", "hottest expert of one layer",
           f"layer {layer} expert {expert}: {share:.0%} of that layer's tokens"),
        ev("placement", "placement", _ranks_text(s.placement) if multi else None),
        ev("rank_share", "routed tokens per rank", shares),
        ev("hot_rank", "busiest rank", s.hot_rank if multi else None),
        ev("hot_rank_pct", "busiest rank's share", max(s.rank_share, default=1.0), "%"),
        ev("rank_max_mean", "busiest rank / mean, per step and layer", s.rank_max_mean, "×"),
        ev("us_per_token", "time of one token in one expert", s.us_per_token, "µs"),
        ev("cost_source", "measured from", s.cost_source),
        ev("cost_ms", "step time lost per step", s.cost_ms / per_step, "ms"),
        ev("step_ms", "step time", s.step_ms / per_step, "ms"),
        ev("wait_ms", "waiting in collectives, per rank", waits or "no collectives"),
        ev("combine_wait_ms", "of which at the MoE combines", at_combines or None),
        ev("rank_cpu", "CPU per second of forward, per rank",
           ", ".join(f"rank {r}: {c:.2f}" for r, c in s.rank_cpu_per_s.items()) or None),
        ev("advice", "advice", _advice(s)),
    )  # fmt: skip
    caveat = _cores_short(s, run_device(ctx.run))
    if caveat:
        evidence = tuple(
            ev("advice", "advice", e.value + caveat) if e.name == "advice" else e for e in evidence
        )
    return Fact(s.cost_share, evidence, impact=s.cost_share, action=_action(s))
