"""`perfdiag analyze --details`: the serving analyses as tables (metrics, TTFT critical
path, ITL attribution, load checks, scheduler, cache, fairness)."""

from __future__ import annotations

from rich.table import Table

from .app import out
from .fit import fit


def _ms(s) -> str:
    return _num(None if s is None else s * 1e3)


def _pct(x) -> str:
    return "–" if x is None or x != x else f"{round(x * 100, 1) + 0.0:.1f}%"


def _num(x, digits: int = 2) -> str:
    # round first so that -1e-19 prints as 0.00, not -0.00
    return "–" if x is None or x != x else f"{round(x, digits) + 0.0:,.{digits}f}"


def _yes(flag) -> str:
    return "–" if flag is None else ("[red]yes[/]" if flag else "[green]no[/]")


def print_header(a) -> None:
    from ..analyzers.lifecycle import Missing

    w = a.window
    if not isinstance(w, Missing):
        kind = "steady state" if w.steady else f"whole run ({w.reason})"
        out.print(
            f"[bold]{a.run_id}[/]  {a.basis} view · window: {kind}, {w.duration_s:.3f} s "
            f"(ramp-up {w.ramp_up_s:.3f} s, drain {w.drain_s:.3f} s excluded)",
            highlight=False,
        )
    else:
        out.print(f"[bold]{a.run_id}[/]  no requests", highlight=False)


def print_tables(a) -> None:
    from ..analyzers.lifecycle import Missing

    for section, printer in (
        (a.metrics, _metrics),
        (a.ttft, _ttft),
        (a.itl, _itl),
        (a.load, _load),
        (a.composition, lambda c: _scheduler(c, a.step_cost, a.preemptions)),
        (a.host, lambda h: _host(h, a.inflation, a.probe_stalls)),
        (a.limits, _limits),
        (a.cache, lambda c: _cache(c, a.fairness)),
    ):
        if not isinstance(section, Missing):
            printer(section)
    if getattr(a, "speculative", None) is not None:  # only runs with the spec_* counters
        from .analyze_spec import print_speculative

        print_speculative(a.speculative)


def print_missing(a) -> None:
    from ..analyzers.lifecycle import Missing

    for m in (x for x in _sections(a) if isinstance(x, Missing)):
        out.print(f"[yellow]{m.analysis}[/]: not available, the run lacks {', '.join(m.needs)}")


def _sections(a):
    return (
        a.window,
        a.metrics,
        a.ttft,
        a.itl,
        a.load,
        a.composition,
        a.step_cost,
        a.host,
        a.limits,
        a.preemptions,
        a.cache,
        a.fairness,
    )


def _metrics(m) -> None:
    o, r = m.outcomes, m.rates
    out.print(
        f"requests {o.requests} (ok {o.ok}, cancelled {o.cancelled}, timeout {o.timeout}, "
        f"rejected {o.rejected}, error {o.error}; warm-up excluded {o.warmup_excluded}) · "
        f"error {_pct(r.error_rate)}, rejected {_pct(r.rejection_rate)}, "
        f"cancelled {_pct(r.cancellation_rate)}, timeout {_pct(r.timeout_rate)}",
        highlight=False,
    )
    t = Table("metric (ms)", "n", "mean", "p50", "p90", "p95", "p99", "max", title="latency")
    for name, d in (
        ("TTFT", m.ttft_s),
        ("TPOT", m.tpot_s),
        ("E2E", m.e2e_s),
        ("ITL per chunk", m.itl_per_chunk_s),
        ("ITL per token", m.itl_per_token_s),
    ):
        t.add_row(
            name,
            str(d.count),
            *(_ms(getattr(d, k)) for k in ("mean", "p50", "p90", "p95", "p99", "max")),
        )
    d = m.tokens_per_chunk
    t.add_row(
        "tokens per chunk",
        str(d.count),
        *(_num(getattr(d, k)) for k in ("mean", "p50", "p90", "p95", "p99", "max")),
    )
    out.print(fit(t, out))
    tp = m.throughput
    t = Table("throughput", "value", title=f"over {tp.window_s:.3f} s")
    t.add_row("output tokens/s (delivered)", _num(tp.output_tokens_per_s, 1))
    t.add_row("total tokens/s (input + output)", _num(tp.total_tokens_per_s, 1))
    t.add_row("requests/s (completed ok, warm-up excluded)", _num(tp.requests_per_s))
    g = m.goodput
    if g is not None:
        targets = ", ".join(
            f"{k} {_ms(getattr(g.slo, f'{k}_s'))} ms"
            for k in ("ttft", "tpot", "itl", "e2e")
            if getattr(g.slo, f"{k}_s")
        )
        t.add_row(f"SLO attainment ({targets})", f"{_pct(g.attainment)} of {g.judged}")
        t.add_row("goodput requests/s", _num(g.requests_per_s))
        t.add_row("goodput output tokens/s", _num(g.output_tokens_per_s, 1))
        t.add_row(
            "misses: failed / ttft / tpot / itl / e2e",
            f"{g.missed_failed} / {g.missed_ttft} / {g.missed_tpot} / {g.missed_itl} / "
            f"{g.missed_e2e}",
        )
    out.print(fit(t, out))


_TTFT_ROWS = (
    ("input processing", "input_s"),
    ("engine queue", "queue_s"),
    ("unhidden cache load", "cache_load_s"),
    ("prefill: own compute", "prefill_own_s"),
    ("prefill: fixed cost of its steps", "step_overhead_s"),
    ("prefill: others' work", "prefill_others_s"),
    ("step inflation (beyond the model)", "inflation_s"),
    ("probe stalls", "probe_s"),
    ("host/scheduler gaps", "host_gap_s"),
    ("sampling and return", "sample_return_s"),
    ("unexplained remainder", "remainder_s"),
)


def _ttft(d) -> None:
    t = Table(
        "part (ms)",
        "mean",
        "p50",
        "p99 (tail)",
        title=f"TTFT critical path (remainder {_pct(d.remainder_share)} of TTFT)",
    )
    rows = (d.mean, d.p50, d.p99)
    t.add_row(
        "[dim]client wait (before send)[/]", *(f"[dim]{_ms(r.client_wait_s)}[/]" for r in rows)
    )
    for label, key in _TTFT_ROWS:
        t.add_row(label, *(_ms(getattr(r, key)) for r in rows))
    t.add_row("[bold]TTFT[/]", *(f"[bold]{_ms(r.ttft_s)}[/]" for r in rows))
    t.add_row("[dim]requests[/]", *(f"[dim]{r.requests}[/]" for r in rows))
    out.print(fit(t, out))


def _itl(a) -> None:
    from ..analyzers.itl import CAUSES

    t = Table(
        "cause",
        "mean ms/gap",
        "share",
        "tail ms/gap",
        "tail share",
        "dominates",
        title=f"ITL attribution ({a.mean.gaps} gaps; tail: ≥ p99, {a.tail.gaps} gaps)",
    )
    for c in CAUSES:
        m, tl = getattr(a.mean, f"{c}_s"), getattr(a.tail, f"{c}_s")
        t.add_row(
            c.replace("_", " "),
            _ms(m),
            _pct(m / a.mean.gap_s if a.mean.gap_s else None),
            _ms(tl),
            _pct(tl / a.tail.gap_s if a.tail.gap_s else None),
            str(getattr(a.dominant, c)),
        )
    out.print(fit(t, out))


def _host(h, inflation, probes) -> None:
    from ..analyzers.lifecycle import Missing

    t = Table("host", "value", title="the host during the run")
    t.add_row("cores / used by others / machine busy",
              f"{h.cores} / {_num(h.others_cores)} / {_pct(h.machine_busy_share)}")  # fmt: skip
    t.add_row("CPU per second of step (median / when not starved)",
              f"{_num(h.step_cpu_ratio)} / {_num(h.reference_ratio)}")  # fmt: skip
    t.add_row("involuntary switches per second of step (median)", _num(h.switches_per_s, 0))
    t.add_row("starved steps / their time / time lost",
              f"{h.starved_steps} / {_pct(h.starved_share)} / {_ms(h.lost_s)} ms")  # fmt: skip
    if not isinstance(inflation, Missing):
        reasons = ", ".join(f"{k} {_ms(v)}" for k, v in inflation.by_reason_s.items() if v > 0)
        t.add_row("inflation by what the run recorded (ms)", reasons or "none")
    if not isinstance(probes, Missing) and probes.count:
        t.add_row("probe stalls", ", ".join(probes.names))
    out.print(fit(t, out))


def _limits(lim) -> None:
    if not lim.steps_with_queue:
        return
    t = Table("limit", "share of steps with a queue",
              title=f"what held waiting requests back ({lim.steps_with_queue} steps, "
              f"{lim.source}; KV peak {_pct(lim.kv_peak_share)})")  # fmt: skip
    for k, v in lim.shares.items():
        t.add_row(k.replace("_", " "), _pct(v))
    out.print(fit(t, out))


def _load(load) -> None:
    o, bp, f, ll, s = (
        load.offered,
        load.back_pressure,
        load.in_flight,
        load.littles_law,
        load.saturation,
    )
    t = Table("load check", "value", title="load (triage step 2)")
    t.add_row("mode / target rate", f"{o.mode or '–'} / {_num(o.target_rate_rps)} req/s")
    t.add_row(
        "planned / issued / offered rate",
        f"{_num(o.planned_rate_rps)} / {_num(o.issued_rate_rps)} / {_num(o.offered_rate_rps)} req/s"
        f" ({_pct(o.offered_vs_target)} of target)",
    )
    t.add_row("issued below 90% of the plan", _yes(o.under_delivered))
    t.add_row(
        "lateness p50 / p99 / max (ms)",
        f"{_ms(o.lateness_s.p50)} / {_ms(o.lateness_s.p99)} / {_ms(o.lateness_s.max)}"
        f" ({_pct(o.late_share)} late > 1 ms)",
    )
    cap = "none" if bp.concurrency_cap is None else str(bp.concurrency_cap)
    t.add_row("concurrency cap / found full", f"{cap} / {_pct(bp.blocked_share)}")
    t.add_row(
        "client wait p50 / p99 / total",
        f"{_ms(bp.client_wait_s.p50)} / {_ms(bp.client_wait_s.p99)} ms / {bp.total_wait_s:.3f} s",
    )
    t.add_row("back-pressure (offered < target)", _yes(bp.fired))
    t.add_row("in flight mean / peak (window)", f"{_num(f.mean)} / {f.peak}")
    t.add_row(
        "Little: L client / λ·W / engine",
        f"{_num(ll.client_in_flight)} / {_num(ll.lambda_w)} / {_num(ll.engine_in_system)}"
        f" (λ·W off by {_pct(ll.lambda_w_vs_client)}, engine {_pct(ll.engine_vs_client)})",
    )
    t.add_row(
        # every request sent or finished in the window: not the throughput table's rate
        "arrivals / completions (warm-up included)",
        f"{_num(s.arrival_rate_rps)} / {_num(s.completion_rate_rps)} req/s",
    )
    t.add_row(
        "waiting queue slope", f"{_num(s.queue_slope_per_s)} req/s (mean {_num(s.mean_waiting)})"
    )
    t.add_row("saturated", _yes(s.saturated))
    out.print(fit(t, out))


def _price(cost, term: str, seconds: float, digits: int) -> str:
    """A step cost model's price in µs, or "not identified" where the model dropped the
    term (its steps could not tell it apart from the others): unknown, not 0."""
    return _num(seconds * 1e6, digits) if term in cost.terms else "not identified"


def _scheduler(c, cost, pre) -> None:
    from ..analyzers.lifecycle import Missing

    t = Table("scheduler", "value", title="steps and their cost")
    t.add_row("steps: prefill / decode / mixed", f"{c.prefill_only} / {c.decode_only} / {c.mixed}")
    t.add_row("mean sequences per step", _num(c.mean_batch_seqs))
    t.add_row(
        "mean prefill tokens / decode seqs (when present)",
        f"{_num(c.mean_prefill_tokens, 1)} / {_num(c.mean_decode_seqs, 1)}",
    )
    if not isinstance(cost, Missing):
        t.add_row("step cost: fixed / per prompt chunk (ms)",
                  f"{_ms(cost.fixed_s)} / {_ms(cost.per_prefill_chunk_s)}")  # fmt: skip
        t.add_row(
            "  per prefill token / decode seq / context token (µs)",
            f"{_price(cost, 'prefill_tokens', cost.per_prefill_token_s, 3)} / "
            f"{_price(cost, 'decode_seqs', cost.per_decode_seq_s, 3)} / "
            f"{_price(cost, 'context_tokens', cost.per_context_token_s, 4)}",
        )
        t.add_row(
            "  R² / median error / noise σ (ms) / trusted",
            f"{_num(cost.r2, 3)} / {_pct(cost.median_rel_error)} / "
            f"{_ms(cost.residual_sigma_s)} / {cost.trusted}",
        )
        t.add_row(
            "  inflated steps / time beyond the model",
            f"{cost.outliers} / {_ms(cost.inflated_s)} ms ({_pct(cost.inflated_share)})",
        )
        for row in cost.outlier_steps.head(3).itertuples():
            t.add_row(
                f"  inflated step {row.step_id}",
                f"{_ms(row.dur_s)} ms, model says {_ms(row.predicted_s)} ms",
            )
    if not isinstance(pre, Missing):
        t.add_row("preemptions (recompute / swap)", f"{pre.count} ({pre.recompute} / {pre.swap})")
        t.add_row(
            "  recomputed tokens / est. cost",
            f"{pre.recomputed_tokens} / {_ms(pre.recompute_cost_s)} ms",
        )
        t.add_row("  swapped tokens / waiting", f"{pre.swapped_tokens} / {_ms(pre.waiting_s)} ms")
    out.print(fit(t, out))


def _cache(c, fair) -> None:
    import pandas as pd

    from ..analyzers.lifecycle import Missing

    t = Table(
        "tier",
        "hit tokens",
        "hits",
        "compute saved (ms)",
        title=f"prefix cache: {_pct(c.hit_rate)} of {c.prompt_tokens} prompt tokens hit at "
        f"admission; saved {_pct(c.saved_share)} of step time",
    )
    for tier in c.tiers:
        t.add_row(tier.tier, str(tier.hit_tokens), str(tier.events), _ms(tier.saved_s))
    out.print(fit(t, out))
    if isinstance(fair, Missing) or not fair.classes:
        return
    t = Table(
        "prefix class",
        "groups",
        "requests",
        "queue p50 (ms)",
        "p99",
        "max",
        title=f"fairness (cold/hot median wait ×{_num(fair.cold_over_hot_p50)})",
    )
    for k in fair.classes:
        q = k.queue_wait_s
        t.add_row(k.hotness, str(k.groups), str(k.requests), _ms(q.p50), _ms(q.p99), _ms(q.max))
    out.print(fit(t, out))
    t = Table("request", "group", "class", "queue (ms)", "TTFT (ms)", title="longest queue waits")
    for _, row in fair.longest.head(5).iterrows():
        group = "–" if pd.isna(row["prefix_group"]) else str(row["prefix_group"])
        t.add_row(
            str(row["request_id"]),
            group,
            row["hotness"],
            _ms(row["queue_wait_s"]),
            _ms(row["ttft_s"]),
        )
    out.print(fit(t, out))
