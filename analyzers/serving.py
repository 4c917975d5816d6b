"""Every serving analysis of a run in one call: `analyze_serving(run, slo)`.

Each analysis states what it needs; one the run cannot feed (an imported profiler trace
has no requests, an engine-only run no client events) comes back as `Missing` naming
what is absent, and the others still run. `to_jsonable` turns the result into the
content of results/metrics.json (per-row tables stay out: they are for the TUI).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..traces.atomic_file import write_atomic
from ..traces.layout import RESULTS_DIR
from ..traces.reader import Run
from .cache import CacheAnalysis, cache_hits
from .fairness import Fairness, fairness
from .host import HostConditions, Inflation, ProbeStalls, explain_inflation, host_conditions
from .host import probe_stalls as find_probe_stalls
from .itl import ItlAttribution, attribute_itl
from .lifecycle import Lifecycle, Missing, build_lifecycle
from .load import LoadChecks, load_checks
from .metrics import ServingMetrics, delivery_gaps, serving_metrics
from .run_config import engine_setting
from .scheduler import BindingLimits, Composition, Preemptions, binding_limits, composition
from .scheduler import preemptions as find_preemptions
from .slo import Slo
from .speculative import SpecSummary, has_speculation
from .speculative import summarize as summarize_speculation
from .steady_state import INTERNAL, Window, find_window
from .step_cost import MIN_STEPS, StepCostModel, fit_step_cost
from .step_cost_roofline import hardware_of
from .steptime import StepParts, StepTimeline
from .ttft import TtftDecomposition, decompose_ttft

METRICS_FILE = "metrics.json"


@dataclass(frozen=True)
class Timing:
    analysis: str
    seconds: float


@dataclass(frozen=True)
class ServingAnalysis:
    run_id: str
    run_path: str
    basis: str | None  # client | engine (None: no requests)
    window: Window | Missing
    metrics: ServingMetrics | Missing
    ttft: TtftDecomposition | Missing
    itl: ItlAttribution | Missing
    load: LoadChecks | Missing
    composition: Composition | Missing
    step_cost: StepCostModel | Missing
    host: HostConditions | Missing
    probe_stalls: ProbeStalls | Missing
    inflation: Inflation | Missing
    limits: BindingLimits | Missing
    preemptions: Preemptions | Missing
    cache: CacheAnalysis | Missing
    fairness: Fairness | Missing
    # Speculative decoding's figures, only when the run recorded its spec_* counters
    # (None otherwise: nothing about speculation is inferred from an absent column).
    speculative: SpecSummary | None = None
    timings: tuple[Timing, ...] = field(default=(), metadata=INTERNAL)


def analyze_serving(run: Run, slo: Slo | None = None, steady: bool = True) -> ServingAnalysis:
    timings: list[Timing] = []

    def timed(name: str, fn, *args):
        start = time.perf_counter()
        result = fn(*args)
        timings.append(Timing(name, time.perf_counter() - start))
        return result

    lc = timed("lifecycle", build_lifecycle, run)
    origin = lc.origin_ns if isinstance(lc, Lifecycle) else 0
    steps = timed("step timeline", StepTimeline.from_run, run, origin)
    no_steps = Missing("scheduler", ("steps",))
    comp = timed("batch composition", composition, steps) if steps is not None else no_steps
    cost = timed("step cost", fit_step_cost, steps, hardware_of(run))
    step_cost = cost if cost is not None else Missing("step cost", (f"{MIN_STEPS}+ steps",))
    parts = StepParts.from_model(steps, cost) if steps is not None else None
    cost_steps = cost.per_step if cost is not None else None
    host = timed("host", host_conditions, run, steps, cost_steps) if steps is not None else None
    no_cpu = Missing("host", ("steps.cpu_time_ns",))
    stalls = timed("probe stalls", find_probe_stalls, run, origin)
    inflation = (
        timed("inflation", explain_inflation, run, steps, cost.per_step, host, stalls)
        if cost is not None
        else Missing("inflation", (f"{MIN_STEPS}+ steps",))
    )
    config = run.manifest.config
    limits = binding_limits(
        run.steps,
        engine_setting(config, "max_seqs", "scheduler", "max_num_seqs"),
        engine_setting(config, "max_batched_tokens", "scheduler", "max_num_batched_tokens"),
    )
    common = dict(
        composition=comp,
        step_cost=step_cost,
        host=host if host is not None else no_cpu,
        probe_stalls=stalls,
        inflation=inflation,
        limits=limits if limits is not None else Missing("limits", ("steps.num_waiting",)),
        speculative=(
            timed("speculative", summarize_speculation, run) if has_speculation(run) else None
        ),
    )
    if isinstance(lc, Missing):
        names = ("window", "metrics", "ttft", "itl", "load", "preemptions", "cache", "fairness")
        return ServingAnalysis(
            run.manifest.run_id,
            str(run.path),
            None,
            **{name: Missing(name, lc.needs) for name in names},
            **common,
            timings=tuple(timings),
        )

    window = timed("steady state", find_window, lc.requests, origin, steady)
    r = lc.requests
    sent = r["t_sent"].to_numpy()
    select = ~r["is_warmup"].to_numpy() & (sent >= window.t_start) & (sent <= window.t_end)
    metrics = timed("metrics", serving_metrics, lc, window, slo)
    no_engine = ("request_events.engine",)
    if lc.has_engine:
        if steps is not None and steps.replica is not None:  # the followed replica's requests
            select = select & (r["replica"].to_numpy() == steps.replica)
        ttft = timed("ttft", decompose_ttft, lc, steps, select, parts, stalls.stalls)
        gaps = metrics.gaps if isinstance(metrics, ServingMetrics) else delivery_gaps(lc)
        itl = timed("itl", attribute_itl, lc, gaps, steps, select, parts, stalls.stalls)
        pre = timed("preemptions", find_preemptions, lc, steps, cost)
        busy = comp.busy_s if isinstance(comp, Composition) else 0.0
        cache = timed("cache", cache_hits, lc, cost, busy)
        fair = timed("fairness", fairness, lc, ttft.per_request, select)
    else:
        ttft, itl = Missing("ttft", no_engine), Missing("itl", no_engine)
        pre, cache = Missing("preemptions", no_engine), Missing("cache", no_engine)
        fair = Missing("fairness", no_engine)
    if lc.basis == "client":
        arrival = run.manifest.config.get("run_options", {}).get("workload", {}).get("arrival")
        load = timed("load", load_checks, lc, window, steps, arrival or {})
    else:
        load = Missing("load", ("request_events.client",))
    return ServingAnalysis(
        run_id=run.manifest.run_id,
        run_path=str(run.path),
        basis=lc.basis,
        window=window,
        metrics=metrics,
        ttft=ttft,
        itl=itl,
        load=load,
        **common,
        preemptions=pre,
        cache=cache,
        fairness=fair,
        timings=tuple(timings),
    )


_KEYS = (str, int, float, bool, type(None))  # the key types json.dumps writes itself


def to_jsonable(obj):
    """Dataclasses → dicts (fields marked INTERNAL left out), frames → records, NaN and
    ±Infinity → null (at any depth: strict JSON), numpy scalars → Python numbers,
    pandas' missing values → null."""
    if isinstance(obj, Missing):
        return {"missing": list(obj.needs)}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: to_jsonable(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if f.metadata.get("json", True)
        }
    if isinstance(obj, pd.DataFrame):
        return json.loads(obj.to_json(orient="records"))  # pandas writes NaN, ±inf as null
    if isinstance(obj, dict):
        return {k if isinstance(k, _KEYS) else str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [to_jsonable(v) for v in obj.tolist()]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if obj is pd.NA or obj is pd.NaT:
        return None
    return obj


def write_metrics(analysis: ServingAnalysis, run_path: str | os.PathLike) -> Path:
    """Write results/metrics.json into the run (atomically: write, then rename)."""
    results = Path(run_path) / RESULTS_DIR
    results.mkdir(parents=True, exist_ok=True)
    target = results / METRICS_FILE
    return write_atomic(target, json.dumps(to_jsonable(analysis), indent=2) + "\n")
