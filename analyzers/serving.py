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

from ..traces.layout import RESULTS_DIR
from ..traces.reader import Run
from .cache import CacheAnalysis, cache_hits
from .fairness import Fairness, fairness
from .itl import ItlAttribution, attribute_itl
from .lifecycle import Lifecycle, Missing, build_lifecycle
from .load import LoadChecks, load_checks
from .metrics import ServingMetrics, delivery_gaps, serving_metrics
from .scheduler import (
    MIN_STEPS,
    Composition,
    Preemptions,
    StepCostModel,
    composition,
    fit_step_cost,
)
from .scheduler import preemptions as find_preemptions
from .slo import Slo
from .steady_state import INTERNAL, Window, find_window
from .steptime import StepTimeline, WorkWeights
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
    preemptions: Preemptions | Missing
    cache: CacheAnalysis | Missing
    fairness: Fairness | Missing
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
    cost = fit_step_cost(comp) if isinstance(comp, Composition) else None
    step_cost = cost if cost is not None else Missing("step cost", (f"{MIN_STEPS}+ steps",))
    weights = cost.weights() if cost is not None else WorkWeights()
    if isinstance(lc, Missing):
        names = ("window", "metrics", "ttft", "itl", "load", "preemptions", "cache", "fairness")
        return ServingAnalysis(
            run.manifest.run_id,
            str(run.path),
            None,
            **{name: Missing(name, lc.needs) for name in names},
            composition=comp,
            step_cost=step_cost,
            timings=tuple(timings),
        )

    window = timed("steady state", find_window, lc.requests, origin, steady)
    r = lc.requests
    sent = r["t_sent"].to_numpy()
    select = ~r["is_warmup"].to_numpy() & (sent >= window.t_start) & (sent <= window.t_end)
    metrics = timed("metrics", serving_metrics, lc, window, slo)
    no_engine = ("request_events.engine",)
    if lc.has_engine:
        ttft = timed("ttft", decompose_ttft, lc, steps, select, weights)
        gaps = metrics.gaps if isinstance(metrics, ServingMetrics) else delivery_gaps(lc)
        itl = timed("itl", attribute_itl, lc, gaps, steps, select, weights)
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
        composition=comp,
        step_cost=step_cost,
        preemptions=pre,
        cache=cache,
        fairness=fair,
        timings=tuple(timings),
    )


def to_jsonable(obj):
    """Dataclasses → dicts (fields marked INTERNAL left out), frames → records, NaN →
    null, numpy scalars → Python numbers."""
    if isinstance(obj, Missing):
        return {"missing": list(obj.needs)}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            f.name: to_jsonable(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if f.metadata.get("json", True)
        }
    if isinstance(obj, pd.DataFrame):
        return json.loads(obj.to_json(orient="records"))
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_metrics(analysis: ServingAnalysis, run_path: str | os.PathLike) -> Path:
    """Write results/metrics.json into the run (atomically: write, then rename)."""
    results = Path(run_path) / RESULTS_DIR
    results.mkdir(parents=True, exist_ok=True)
    target = results / METRICS_FILE
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(to_jsonable(analysis), indent=2) + "\n")
    os.replace(tmp, target)
    return target
