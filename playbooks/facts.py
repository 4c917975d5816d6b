"""The registry of named facts a playbook's checks compare, and what they read.

A fact is a Python function of the triage context (the run, its serving analysis, and
optionally repeats of it and a baseline run) returning a `Fact` — one value to compare
plus the evidence behind it — or `Unavailable`, naming what the run lacks. Playbooks
(YAML) choose the fact, its parameters, the threshold and the words; the arithmetic
stays here, tested, never in the YAML. Each fact declares its parameters and the
evidence names its text may use, so a playbook is checked completely when it loads.

The fact modules register themselves when imported (see `load_registry`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from ..analyzers.actions import Action
from ..analyzers.findings import Evidence, IdList
from ..analyzers.impact import Impact, impact_of, predicted_impact
from ..analyzers.lifecycle import Missing
from ..analyzers.run_config import engine_setting, section
from ..analyzers.serving import ServingAnalysis, analyze_serving
from ..traces.reader import Run

REQUIRED = object()


@dataclass(frozen=True)
class Fact:
    value: float | int | str | bool | None
    evidence: tuple[Evidence, ...] = ()
    ids: tuple[IdList, ...] = ()
    impact: float = 0.0  # 0..1, the share of the problem it explains (ranks findings)
    # The loudest finding the fact's impact on user-facing metrics allows (analyzers/
    # impact.py); None: the check's thresholds alone decide.
    max_severity: str | None = None
    action: Action | None = None  # the advice as a concrete change (analyzers/actions.py)
    # Evidence whose text is empty (advice the run gives no ground for): no row to read,
    # but a playbook text still renders it as empty. Filled from `evidence` on creation.
    blank: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self):
        empty = [isinstance(e.value, str) and not e.value.strip() for e in self.evidence]
        if any(empty):
            kept = tuple(e for e, no in zip(self.evidence, empty, strict=True) if not no)
            names = (e.name for e, no in zip(self.evidence, empty, strict=True) if no)
            object.__setattr__(self, "evidence", kept)
            object.__setattr__(self, "blank", (*self.blank, *names))

    def values(self) -> dict[str, Any]:
        return (
            dict.fromkeys(self.blank, "")
            | {e.name: e.value for e in self.evidence}
            | {"value": self.value}
        )


@dataclass(frozen=True)
class Unavailable:
    reason: str  # what the run lacks, e.g. "the run has no steps table"


@dataclass(frozen=True)
class Param:
    type: type
    default: Any = REQUIRED
    choices: tuple = ()


@dataclass(frozen=True)
class FactSpec:
    name: str
    fn: Callable[..., Fact | Unavailable]
    params: dict[str, Param]
    provides: tuple[str, ...]  # evidence names (plus "value") a text may use
    doc: str = ""


FACTS: dict[str, FactSpec] = {}


def fact(name: str, provides: tuple[str, ...] = (), **params: Param):
    """Register `fn(ctx, **params)` as the fact `name`."""

    def register(fn):
        doc = (fn.__doc__ or "").strip().split("\n\n")[0]
        FACTS[name] = FactSpec(name, fn, params, ("value", *provides), " ".join(doc.split()))
        return fn

    return register


def load_registry() -> dict[str, FactSpec]:
    from . import (  # noqa: F401
        facts_client,
        facts_compare,
        facts_critical_path,
        facts_experts,
        facts_gate,
        facts_host,
        facts_latency,
        facts_load,
        facts_offload,
        facts_overlap,
        facts_parallel,
        facts_pipeline,
        facts_replicas,
        facts_resources,
        facts_scheduling,
        facts_server,
        facts_speculative,
        facts_target,
    )

    return FACTS


def evaluate_fact(name: str, ctx: TriageContext, params: dict) -> Fact | Unavailable:
    spec = load_registry()[name]
    args = {k: params.get(k, p.default) for k, p in spec.params.items()}
    return spec.fn(ctx, **args)


class TriageContext:
    """What facts read. Derived tables are computed on first use and kept."""

    def __init__(
        self,
        run: Run,
        serving: ServingAnalysis | None = None,
        repeats: tuple[TriageContext, ...] = (),
        baseline: TriageContext | None = None,
    ) -> None:
        self.run = run
        self.serving = serving if serving is not None else analyze_serving(run)
        self.repeats = repeats
        self.baseline = baseline
        self.memo: dict = {}  # results several facts share (e.g. the metric deltas)

    @property
    def config(self) -> dict:
        return self.run.manifest.config or {}

    @property
    def slo(self):
        """The SLO the analysis judged against (analyze --slo), or None."""
        m = self.get("metrics")
        return m.goodput.slo if m is not None and m.goodput is not None else None

    def engine_setting(self, option: str, section: str, key: str):
        """An engine setting as the run recorded it (analyzers/run_config.py)."""
        return engine_setting(self.config, option, section, key)

    @property
    def chunk_size(self) -> int | None:
        """Tokens per prefill chunk; None when chunked prefill is off or not recorded."""
        engine = section(self.run_options, "engine")
        if "chunk_size" in engine:
            return engine["chunk_size"]
        sched = section(self.config, "engine_config", "scheduler")
        return sched.get("chunk_size") if sched.get("enable_chunked_prefill") else None

    @property
    def run_options(self) -> dict:
        opts = self.config.get("run_options")
        return opts if isinstance(opts, dict) else {}

    def get(self, name: str):
        """A serving analysis by name, or None when it could not run."""
        value = getattr(self.serving, name)
        return None if isinstance(value, Missing) else value

    def missing(self, name: str) -> Unavailable:
        value = getattr(self.serving, name)
        needs = ", ".join(value.needs) if isinstance(value, Missing) else "?"
        return Unavailable(f"no {name} analysis: the run lacks {needs}")

    @cached_property
    def phases(self) -> pd.DataFrame:
        """Per step: seconds in each engine phase (schedule, prepare_inputs, forward,
        sample, post_process); empty when the run recorded no phases."""
        sp = self.run.spans
        sel = (sp["category"] == "phase").to_numpy() & sp["step_id"].notna().to_numpy()
        ph = sp[sel]
        if not len(ph):
            return pd.DataFrame()
        frame = pd.DataFrame(
            {
                "step_id": ph["step_id"].to_numpy(np.int64),
                "name": ph["name"].astype(str).to_numpy(),
                "dur_s": ph["dur_ns"].to_numpy(np.float64) / 1e9,
            }
        )
        return frame.pivot_table(index="step_id", columns="name", values="dur_s", aggfunc="sum")

    @cached_property
    def timeline(self):
        """The timeline report (GPU gaps, overlap, per-rank breakdown), or None when the
        run has no spans on a device and no collectives."""
        sp = self.run.spans
        if not len(sp):
            return None
        on_device = sp["device"].notna().to_numpy() | (sp["category"] == "comm").to_numpy()
        if not on_device.any():
            return None
        from ..analyzers.report import timeline_report

        return timeline_report(self.run)

    @cached_property
    def critical_path(self):
        """The critical path through the traced steps, or None without GPU work."""
        tl = self.timeline
        if tl is None or not tl.gpu_ops:
            return None
        from ..analyzers.critical_path import run_critical_path

        return run_critical_path(self.run)


# -- helpers for fact modules ----------------------------------------------------------------
def ev(name: str, label: str, value, unit: str = "") -> Evidence:
    if isinstance(value, np.generic):
        value = value.item()
    return Evidence(name, label, value, unit)


# A price the step cost model dropped (analyzers/step_cost.py keeps only the terms its
# steps can tell apart): it is not 0, it is unknown.
NOT_IDENTIFIED = "not identified (the steps cannot tell it apart from the other costs)"


def token_price(cost) -> Evidence:
    """A prefill token's price as evidence: `per_token_us`, or when the model dropped the
    term, a row saying so under another name (a text's `[… {per_token_us} µs]` is then
    left out rather than read as 0 µs)."""
    if "prefill_tokens" in cost.terms:
        return ev("per_token_us", "per prefill token", cost.per_prefill_token_s * 1e6, "µs")
    return ev("per_token_unidentified", "per prefill token", NOT_IDENTIFIED)


def ms(seconds: float | None) -> float:
    return float("nan") if seconds is None else float(seconds) * 1e3


def share(part: float, whole: float) -> float:
    return float(part / whole) if whole and whole > 0 and math.isfinite(part) else float("nan")


def worst(
    frame: pd.DataFrame,
    column: str,
    label: str,
    kind: str = "request",
    n: int = 5,
    id_column: str = "request_id",
) -> IdList:
    """The `n` distinct ids whose largest positive `column` is largest. A frame may hold
    several rows per id (one per ITL gap): each id is named once, by its worst row."""
    if not len(frame) or column not in frame:
        return IdList(kind, label, ())
    values = pd.to_numeric(frame[column], errors="coerce")
    keep = (values > 0).fillna(False).to_numpy(bool)  # NA: not positive
    rows = pd.DataFrame({"id": frame[id_column].to_numpy()[keep],
                         "v": values.to_numpy("float64", na_value=np.nan)[keep]})  # fmt: skip
    top = rows.sort_values("v", ascending=False, kind="stable").drop_duplicates("id").head(n)
    return IdList(kind, label, tuple(str(v) for v in top["id"].tolist()))


def finite(x) -> bool:
    return x is not None and isinstance(x, int | float) and math.isfinite(x)


def impact_evidence(impact: Impact, metric: str) -> tuple:
    """Evidence of how much removing a cause would move the metric (analyzers/impact.py)."""
    out = (
        ev("mean_gain", f"mean {metric} without it", -impact.mean_gain, "%"),
        ev("tail_gain", f"p99 {metric} without it", -impact.tail_gain, "%"),
    )
    if impact.slo_gain is not None:
        out += (ev("slo_gain", "requests it alone makes miss the SLO", impact.slo_gain, "%"),)
    if impact.target_gain is not None:
        low, high = impact.target_gain_ci or (impact.target_gain, impact.target_gain)
        out += (
            ev("predicted_gain", f"{impact.target} with the advice (predicted)",
               -impact.target_gain, "%"),
            ev("predicted_interval", "its 95 % interval (bootstrap)",
               f"{-high:+.0%} to {-low:+.0%}"),
        )  # fmt: skip
    return out


def ttft_impact(ctx: TriageContext, per_request, part: str) -> Impact:
    """Removing one TTFT part from each request, against the SLO's TTFT bound if any."""
    slo = ctx.slo
    target = slo.ttft_s if slo is not None else None
    return impact_of(per_request["ttft_s"].to_numpy(), per_request[part].to_numpy(), target)


def itl_impact(ctx: TriageContext, per_gap, column: str) -> Impact:
    """Per gap against an ITL bound; per request (its mean gap) against a TPOT bound."""
    slo = ctx.slo
    if slo is not None and slo.itl_s is None and slo.tpot_s is not None:
        by = per_gap.groupby("code", sort=False)[["gap_s", column]].mean()
        return impact_of(by["gap_s"].to_numpy(), by[column].to_numpy(), slo.tpot_s)
    target = slo.itl_s if slo is not None else None
    return impact_of(per_gap["gap_s"].to_numpy(), per_gap[column].to_numpy(), target)


def ttft_predicted(ctx: TriageContext, per_request, saved: str, target: str) -> Impact:
    """An advice predicted to save `saved` of each request's TTFT, judged on `target`."""
    slo = ctx.slo
    bound = slo.ttft_s if slo is not None else None
    ttft = per_request["ttft_s"].to_numpy()
    return predicted_impact(ttft, per_request[saved].to_numpy(), target, bound)


def itl_predicted(ctx: TriageContext, per_gap, saved: str, target: str) -> Impact:
    """An advice predicted to save `saved` of each gap, judged on `target` (per request,
    its mean gap, against a TPOT bound)."""
    slo = ctx.slo
    if slo is not None and slo.itl_s is None and slo.tpot_s is not None:
        by = per_gap.groupby("code", sort=False)[["gap_s", saved]].mean()
        return predicted_impact(by["gap_s"].to_numpy(), by[saved].to_numpy(), target, slo.tpot_s)
    bound = slo.itl_s if slo is not None else None
    return predicted_impact(per_gap["gap_s"].to_numpy(), per_gap[saved].to_numpy(), target, bound)


def arrival_spec(ctx: TriageContext) -> dict:
    """The workload's arrival process as recorded ({} when not recorded): mode open or
    closed, rate, concurrency (a closed loop's clients, an open loop's cap)."""
    arrival = (ctx.run_options.get("workload") or {}).get("arrival")
    return arrival if isinstance(arrival, dict) else {}


def slot_factor(ctx: TriageContext) -> float:
    """How much TTFT a second saved of a request's time in the engine (the slot it holds:
    E2E less its queue and input) saves in all. In a closed loop of n clients held at a
    limit of c running requests, throughput is c / S for slot time S, each client cycles
    in n·S / c, so the queue is S·(n − c) / c: a service saving Δ shortens it by
    Δ·(n − c) / c too, and TTFT by Δ·(1 + queue / S), read from the run's own means.
    1 for an open loop (its queue falls faster still, but by how much depends on the
    arrivals: not claimed) and where the run cannot say."""
    if arrival_spec(ctx).get("mode") != "closed":
        return 1.0
    t, m = ctx.get("ttft"), ctx.get("metrics")
    if t is None or m is None or "e2e_s" not in m.per_request:
        return 1.0
    e2e = m.per_request["e2e_s"].to_numpy("float64")
    e2e = float(np.nanmean(e2e)) if np.isfinite(e2e).any() else float("nan")
    slot = e2e - t.mean.queue_s - t.mean.input_s
    if not (np.isfinite(slot) and slot > 0 and t.mean.queue_s > 0):
        return 1.0
    return 1.0 + t.mean.queue_s / slot


def stall_predicted(per_gap, saved: str, target: str) -> Impact:
    """An advice predicted to save `saved` of each gap, judged on each request's longest
    gap (`stall.p90`: the stall that 1 in 10 requests' streams showed)."""
    g = per_gap.assign(after_s=per_gap["gap_s"] - per_gap[saved].fillna(0.0))
    by = g.groupby("code", sort=False)[["gap_s", "after_s"]].max()
    before = by["gap_s"].to_numpy("float64")
    return predicted_impact(before, before - by["after_s"].to_numpy("float64"), target)
