"""Facts of steps 6 and 7: against a baseline run, did only one main variable change, did
the end-to-end metrics move beyond noise, are the outputs still correct? Without a
baseline, step 7 still checks the run's own failures."""

from __future__ import annotations

from ..analyzers.compare import config_diff, correctness, metric_deltas
from ..analyzers.findings import IdList
from .facts import Fact, Param, TriageContext, Unavailable, ev, fact

NO_BASELINE = "needs a baseline run (perfdiag compare BASELINE RUN, or analyze --baseline)"


@fact("changed_variables", provides=("variables", "names", "config", "environment", "measurement"))
def changed_variables(ctx: TriageContext) -> Fact | Unavailable:
    """How many main variables (configuration and environment settings) differ from the
    baseline: with more than one, no difference can be pinned on any of them."""
    if ctx.baseline is None:
        return Unavailable(NO_BASELINE)
    diff = config_diff(ctx.baseline.run.manifest, ctx.run.manifest, ctx.baseline.get("host"),
                       ctx.get("host"))  # fmt: skip

    def names(kind: str) -> str:
        return ", ".join(c.name for c in diff.changes if c.kind == kind) or "none"

    evidence = (
        ev("variables", "main variables changed", len(diff.variables)),
        ev("names", "which", ", ".join(c.name for c in diff.variables) or "none"),
        ev("config", "configuration", names("config")),
        ev("environment", "environment", names("environment")),
        ev("measurement", "measurement settings (not counted)", names("measurement")),
    )
    return Fact(len(diff.variables), evidence)


def _deltas(ctx: TriageContext):
    if "deltas" not in ctx.memo:
        ctx.memo["deltas"] = metric_deltas(ctx.baseline.serving, ctx.serving)
    return ctx.memo["deltas"]


@fact(
    "latency_regression",
    provides=("metric", "unit", "a", "b", "relative", "ci_low", "ci_high", "worse"),
    min_relative=Param(float, 0.05),
)
def latency_regression(ctx: TriageContext, min_relative: float) -> Fact | Unavailable:
    """The largest relative worsening against the baseline among the latency percentiles
    whose bootstrap interval excludes no change (and at least `min_relative`)."""
    if ctx.baseline is None:
        return Unavailable(NO_BASELINE)
    deltas = _deltas(ctx)
    if not deltas:
        return Unavailable("a run has no serving metrics")
    # A per-chunk ITL row "worse" while TPOT improved is no regression (compare_itl.py).
    worse = [d for d in deltas
             if d.verdict == "worse" and d.decisive and d.relative >= min_relative]  # fmt: skip
    top = max(worse, key=lambda d: d.relative, default=None)
    evidence = (
        ev("metric", "worst metric", top.label if top else "none"),
        ev("unit", "its unit", top.unit if top else ""),  # the texts' numbers read in it
        ev("a", "baseline", top.a if top else None, top.unit if top else ""),
        ev("b", "this run", top.b if top else None, top.unit if top else ""),
        ev("relative", "change", top.relative if top else 0.0, "%"),
        ev("ci_low", "interval low", top.ci_low if top else None, top.unit if top else ""),
        ev("ci_high", "interval high", top.ci_high if top else None, top.unit if top else ""),
        ev("worse", "metrics worse beyond noise", ", ".join(d.label for d in worse) or "none"),
    )
    value = top.relative if top else 0.0
    return Fact(value, evidence, impact=min(1.0, value))


@fact(
    "output_mismatch",
    provides=("compared", "mismatched", "length_mismatched", "logprobs", "reason"),
)
def output_mismatch(ctx: TriageContext) -> Fact | Unavailable:
    """Share of requests whose generated tokens (output digest) differ from the
    baseline's for the same request."""
    if ctx.baseline is None:
        return Unavailable(NO_BASELINE)
    c = correctness(ctx.baseline.run, ctx.run)
    if not c.comparable:
        return Unavailable(c.reason)
    evidence = (
        ev("compared", "requests compared", c.compared),
        ev("mismatched", "outputs differ", c.mismatched),
        ev("length_mismatched", "of which lengths differ", c.length_mismatched),
        ev("logprobs", "log-probabilities", c.logprobs),
        ev("reason", "compared", c.reason),
    )
    ids = (IdList("request", "output differs from the baseline", c.mismatched_ids[:5]),)
    return Fact(c.mismatch_rate, evidence, ids, impact=c.mismatch_rate)


@fact("failure_rate", provides=("requests", "errors", "rejected", "timeouts", "unfinished"))
def failure_rate(ctx: TriageContext) -> Fact | Unavailable:
    """Share of measured requests that failed: errors, rejections, timeouts, and requests
    that never finished. Speed that drops requests is not speed."""
    m = ctx.get("metrics")
    if m is None:
        return ctx.missing("metrics")
    o = m.outcomes
    failed = o.error + o.rejected + o.timeout + o.unfinished
    value = failed / o.requests if o.requests else 0.0
    evidence = (
        ev("requests", "measured requests", o.requests),
        ev("errors", "errors", o.error),
        ev("rejected", "rejected", o.rejected),
        ev("timeouts", "timeouts", o.timeout),
        ev("unfinished", "unfinished", o.unfinished),
    )
    pr = m.per_request
    bad = pr[pr["in_window"].to_numpy(bool) & ~pr["outcome"].isin(["ok", "cancelled"]).to_numpy()]
    ids = (IdList("request", "failed", tuple(bad["request_id"].astype(str).head(5))),)
    return Fact(value, evidence, ids, impact=value)


@fact(
    "slo_attainment", provides=("targets", "judged", "good", "failed", "ttft", "tpot", "itl", "e2e")
)
def slo_attainment(ctx: TriageContext) -> Fact | Unavailable:
    """Share of judged requests that met every SLO target (analyze --slo): failures,
    rejections and timeouts count as misses."""
    m = ctx.get("metrics")
    if m is None:
        return ctx.missing("metrics")
    g = m.goodput
    if g is None:
        return Unavailable("no SLO given (perfdiag analyze RUN --slo ttft=0.5,tpot=50ms)")
    targets = ", ".join(
        f"{k} {getattr(g.slo, f'{k}_s') * 1e3:g} ms"
        for k in ("ttft", "tpot", "itl", "e2e")
        if getattr(g.slo, f"{k}_s")
    )
    evidence = (
        ev("targets", "targets", targets),
        ev("judged", "requests judged", g.judged),
        ev("good", "met every target", g.good),
        ev("failed", "missed: failed", g.missed_failed),
        ev("ttft", "missed TTFT", g.missed_ttft),
        ev("tpot", "missed TPOT", g.missed_tpot),
        ev("itl", "missed ITL", g.missed_itl),
        ev("e2e", "missed E2E", g.missed_e2e),
    )
    return Fact(g.attainment, evidence, impact=1.0 - g.attainment if g.judged else 0.0)
