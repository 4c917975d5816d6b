"""Facts of the gate (can the data be trusted?) and of step 1 (can the run be reproduced,
and how noisy is it?)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..analyzers.findings import IdList
from ..analyzers.replicas import step_lanes
from ..analyzers.server_settings import driven_server
from . import applicability
from .facts import Fact, TriageContext, Unavailable, ev, fact, finite

# Client and engine milestones that must come in this order for one request.
_CLIENT_ORDER = ("sent", "first_token", "done")
_ENGINE_ORDER = ("arrival", "tokenize_end", "first_token", "finished")


@fact("run_status", provides=("status", "notes"))
def run_status(ctx: TriageContext) -> Fact:
    """The run's status: complete, or interrupted / crashed / still running (partial)."""
    notes = "; ".join(ctx.run.warnings)
    return Fact(
        ctx.run.status, (ev("status", "status", ctx.run.status), ev("notes", "notes", notes))
    )


@fact("dropped_records", provides=("dropped", "rows", "tables"))
def dropped_records(ctx: TriageContext) -> Fact:
    """Share of rows the recorder could not store (malformed), over every table."""
    dropped = ctx.run.manifest.extra.get("dropped_records") or {}
    total_dropped = int(sum(dropped.values()))
    rows = int(sum(ctx.run.row_counts().values()))
    share = total_dropped / (rows + total_dropped) if rows + total_dropped else 0.0
    tables = ", ".join(f"{k} {v}" for k, v in sorted(dropped.items())) or "none"
    evidence = (
        ev("dropped", "rows dropped", total_dropped),
        ev("rows", "rows stored", rows),
        ev("tables", "dropped per table", tables),
    )
    return Fact(share, evidence, impact=min(1.0, share * 10))


@fact("profiler_window_empty", provides=("requested", "captured", "reason"))
def profiler_window_empty(ctx: TriageContext) -> Fact | Unavailable:
    """True when a profiler window was asked for but covers no engine step (it started
    after the run ended, or none of its ops could be placed in a step)."""
    info = ctx.run.manifest.extra.get("profiler_window")
    if not isinstance(info, dict):
        return Unavailable("the run has no profiler window")
    requested = info.get("requested_steps")
    captured = info.get("captured_steps")
    reason = info.get("reason", "")
    empty = captured is None
    if not empty:
        sp = ctx.run.spans
        ops = sp[sp["category"].isin(["cpu_op", "kernel"]).to_numpy()]
        empty = bool(len(ops)) and not ops["step_id"].notna().any()
        reason = reason or ("no profiled op falls inside a step" if empty else "")
    evidence = (
        ev("requested", "requested steps", _steps(requested)),
        ev("captured", "captured steps", _steps(captured)),
        ev("reason", "why", reason),
    )
    return Fact(bool(empty), evidence)


def _steps(pair) -> str:
    return "–" if not pair else f"{pair[0]}..{pair[1]}"


@fact("clock_uncertainty_ms", provides=("origin_ms", "profiler_ms", "clients_ms"))
def clock_uncertainty_ms(ctx: TriageContext) -> Fact | Unavailable:
    """How far timestamps from different clocks may be off (ms): the manifest's clock
    origin, with a profiler window the pinning of its trace to the run's clock, and with
    load split over client shards (--clients) the alignment of their clocks."""
    origin = ctx.run.manifest.clock.get("uncertainty_ns")
    window = ctx.run.manifest.extra.get("profiler_window") or {}
    prof = window.get("clock_sync_uncertainty_ns") if isinstance(window, dict) else None
    shards = ctx.run.manifest.extra.get("client_shards") or {}
    clients = shards.get("clock_uncertainty_ns") if isinstance(shards, dict) else None
    known = [int(x) for x in (origin, prof, clients) if isinstance(x, int | float)]
    if not known:
        return Unavailable("the manifest records no clock uncertainty")
    value = max(known) / 1e6
    evidence = (
        ev("origin_ms", "clock origin", ms_or_nan(origin), "ms"),
        ev("profiler_ms", "profiler trace pinning", ms_or_nan(prof), "ms"),
        ev("clients_ms", "load client shards' clocks", ms_or_nan(clients), "ms"),
    )
    return Fact(value, evidence)


def ms_or_nan(ns) -> float:
    return float(ns) / 1e6 if isinstance(ns, int | float) else float("nan")


@fact("out_of_order", provides=("requests", "bad_requests", "steps", "bad_steps"))
def out_of_order(ctx: TriageContext) -> Fact | Unavailable:
    """Share of requests and steps whose times contradict each other: a request's
    milestones out of order (sent after its first token, …), a step that ends before it
    starts or overlaps the next one on the same rank."""
    ev_ = ctx.run.request_events
    steps = ctx.run.steps
    if not len(ev_) and not len(steps):
        return Unavailable("the run has no request events and no steps")
    bad_req: list[str] = []
    n_req = 0
    if len(ev_):
        first = ev_.pivot_table(
            index="request_id",
            columns=["side", "kind"],
            values="ts_ns",
            aggfunc="min",
            observed=True,
        )
        n_req = len(first)
        bad = np.zeros(n_req, dtype=bool)
        for side, order in (("client", _CLIENT_ORDER), ("engine", _ENGINE_ORDER)):
            cols = [first[(side, k)].to_numpy("float64") for k in order if (side, k) in first]
            for i, a in enumerate(cols):
                for b in cols[i + 1 :]:
                    bad |= a > b  # NaN compares False: a missing milestone is not disorder
        bad_req = [str(r) for r in first.index[bad]]
    bad_steps = _bad_steps(steps)
    n = n_req + len(steps)
    value = (len(bad_req) + len(bad_steps)) / n if n else 0.0
    evidence = (
        ev("requests", "requests", n_req),
        ev("bad_requests", "out of order", len(bad_req)),
        ev("steps", "steps", len(steps)),
        ev("bad_steps", "inconsistent steps", len(bad_steps)),
    )
    ids = (
        IdList("request", "milestones out of order", tuple(bad_req[:5])),
        IdList("step", "ends before it starts or overlaps the next", tuple(bad_steps[:5])),
    )
    return Fact(value, evidence, ids, impact=min(1.0, value * 10))


def _bad_steps(steps: pd.DataFrame) -> list[str]:
    if not len(steps):
        return []
    # One lane per rank and replica: steps of different lanes run side by side.
    s = steps.assign(_rank=step_lanes(steps)).sort_values(["_rank", "start_ns"])
    start, end = s["start_ns"].to_numpy(np.int64), s["end_ns"].to_numpy(np.int64)
    same_rank = s["_rank"].to_numpy()[1:] == s["_rank"].to_numpy()[:-1]
    overlap = np.zeros(len(s), dtype=bool)
    overlap[:-1] = same_rank & (end[:-1] > start[1:])
    bad = (end < start) | overlap
    return [str(v) for v in s["step_id"].to_numpy()[bad]]


@fact("incomplete_lifecycles", provides=("requests", "incomplete", "missing"))
def incomplete_lifecycles(ctx: TriageContext) -> Fact | Unavailable:
    """Share of requests that ended normally but lack a milestone their side records
    (client: sent, first token, done; engine: arrival, first token, finished), or that
    have events but no row in the requests table in a complete run."""
    run = ctx.run
    if not run.row_counts()["requests"] or not run.row_counts()["request_events"]:
        return Unavailable("the run has no requests or no request events")
    # In Arrow: hashed membership tests in C over millions of events (pandas' string
    # isin walks Python objects).
    req = run.arrow("requests", ["request_id", "finish_reason"])
    evt = run.arrow("request_events", ["request_id", "side", "kind"])
    side = pc.cast(evt["side"], pa.string())
    kind = pc.cast(evt["kind"], pa.string())
    reason = pc.cast(req["finish_reason"], pa.string())
    ids = pc.filter(req["request_id"], pc.is_in(reason, value_set=pa.array(["stop", "length"])))
    sides = set(pc.unique(side).drop_null().to_pylist())
    needed = [("client", k) for k in _CLIENT_ORDER if "client" in sides]
    needed += [("engine", k) for k in ("arrival", "first_token", "finished") if "engine" in sides]
    missing_by = {}
    for s, k in needed:  # one membership test per milestone
        present = pc.filter(evt["request_id"], pc.and_(pc.equal(side, s), pc.equal(kind, k)))
        missing_by[f"{s}.{k}"] = np.asarray(pc.invert(pc.is_in(ids, value_set=present)))
    bad: list[str] = []
    if missing_by:
        any_missing = np.logical_or.reduce(list(missing_by.values()))
        bad = pc.filter(ids, pa.array(any_missing)).to_pylist()
    lacking = {g: int(m.sum()) for g, m in missing_by.items() if m.any()}
    orphans: list[str] = []
    if run.status == "complete":
        seen = pc.unique(evt["request_id"])
        orphans = sorted(
            pc.filter(seen, pc.invert(pc.is_in(seen, value_set=req["request_id"]))).to_pylist()
        )
    n = req.num_rows + len(orphans)
    value = (len(bad) + len(orphans)) / n if n else 0.0
    missing = ", ".join(f"{k} ×{v}" for k, v in sorted(lacking.items()))
    if orphans:
        missing = ", ".join(x for x in (missing, f"no requests row ×{len(orphans)}") if x)
    evidence = (
        ev("requests", "requests", n),
        ev("incomplete", "incomplete", len(bad) + len(orphans)),
        ev("missing", "missing milestones", missing or "none"),
    )
    ids_ = (IdList("request", "incomplete lifecycle", tuple((bad + orphans)[:5])),)
    return Fact(value, evidence, ids_, impact=min(1.0, value * 5))


@fact("unexplained_latency", provides=("ttft_share", "itl_share"))
def unexplained_latency(ctx: TriageContext) -> Fact | Unavailable:
    """The largest share of TTFT or ITL the decompositions cannot explain (events or steps
    the run lacks): the later steps' numbers are that much less certain."""
    ttft, itl = ctx.get("ttft"), ctx.get("itl")
    if ttft is None and itl is None:
        return ctx.missing("ttft")
    t = ttft.remainder_share if ttft is not None else float("nan")
    i = itl.remainder_share if itl is not None else float("nan")
    value = max(x for x in (t, i, 0.0) if finite(x))
    evidence = (
        ev("ttft_share", "TTFT unexplained", t, "%"),
        ev("itl_share", "ITL unexplained", i, "%"),
    )
    return Fact(value, evidence, impact=value)


@fact("lost_rows", provides=("tables",))
def lost_rows(ctx: TriageContext) -> Fact:
    """Rows the manifest counted in tables whose file is gone (deleted after the run
    closed): those tables read as empty, so every check on them would mislead."""
    lost = dict(getattr(ctx.run, "lost_tables", {}) or {})
    tables = ", ".join(f"{name} ({rows:,} rows)" for name, rows in sorted(lost.items()))
    return Fact(int(sum(lost.values())), (ev("tables", "tables lost", tables or "none"),))


@fact("missing_parts", provides=("parts", "reasons"))
def missing_parts(ctx: TriageContext) -> Fact | Unavailable:
    """Parts of a run assembled from parts (a --ray import's ranks) that never arrived:
    the manifest's `parts_missing`, each {part, reason, …}; the run holds the rest."""
    parts = ctx.run.manifest.extra.get("parts_missing")
    if parts is None:
        return Unavailable("the run was not assembled from parts")
    parts = [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []
    names = ", ".join(str(p.get("part", "?")) for p in parts)
    reasons = "; ".join(f"{p.get('part', '?')}: {p.get('reason', 'unknown')}" for p in parts)
    evidence = (
        ev("parts", "missing parts", names or "none"),
        ev("reasons", "why", reasons or "none"),
    )
    return Fact(len(parts), evidence)


@fact("missing_tables", provides=("tables", "absent"))
def missing_tables(ctx: TriageContext) -> Fact:
    """How many of the run's tables hold no rows (absent or empty: an imported profiler
    trace has no requests or steps); the checks that need them are not evaluated."""
    absent = list(ctx.run.missing_tables)
    empty = [n for n, rows in ctx.run.row_counts().items() if rows == 0]
    if applicability.trace_kind(ctx.run) is not None:  # a bare trace serves no requests
        empty = [n for n in empty if n not in applicability.SERVING_TABLES]
        absent = [n for n in absent if n not in applicability.SERVING_TABLES]
    evidence = (
        ev("tables", "tables without rows", ", ".join(empty) or "none"),
        ev("absent", "tables with no file", ", ".join(absent) or "none"),
    )
    return Fact(len(empty), evidence)


# -- step 1 --------------------------------------------------------------------------------
_PINS = {
    "perfdiag version": lambda m: m.perfdiag_version,
    "python version": lambda m: m.environment.get("python"),
    "framework versions": lambda m: (m.environment.get("packages") or {}).get("torch"),
    "hardware (CPU/GPU model)": lambda m: (
        m.environment.get("cpu_model") or m.environment.get("gpus")
    ),
    "code revision": lambda m: m.environment.get("git_revision"),
    "engine configuration": lambda m: (
        (m.config.get("run_options") or {}).get("engine") or m.config.get("engine_config")
    ),
    "workload": lambda m: (m.config.get("run_options") or {}).get("workload"),
    "workload seed": lambda m: ((m.config.get("run_options") or {}).get("workload") or {}).get(
        "seed"
    ),
}


def _server(m) -> dict:
    return driven_server(m.config or {})


def _launch(m) -> dict:
    launch = _server(m).get("launch")
    return launch if isinstance(launch, dict) else {}


def _against_server(m) -> bool:
    """A run of `perfdiag run --target/--launch`: `config.server` (older runs:
    `config.target`, with engine_ref's defaults as `run_options.engine`, never the server's)."""
    return bool(_server(m)) or isinstance((m.config or {}).get("target"), dict)


# A server's run is pinned by the server, not by engine_ref: its version stands for the
# framework versions (the client needs no torch) and its launch arguments for the engine
# configuration (none when it was started elsewhere and only --target URL was given).
_SERVER_PINS = {
    "perfdiag version": _PINS["perfdiag version"],
    "python version": _PINS["python version"],
    "server version": lambda m: _server(m).get("version"),
    "hardware (CPU/GPU model)": _PINS["hardware (CPU/GPU model)"],
    "code revision": _PINS["code revision"],
    "server launch arguments": lambda m: _launch(m).get("args") or _launch(m).get("argv"),
    "workload": _PINS["workload"],
    "workload seed": _PINS["workload seed"],
}
NOT_LAUNCHED = (
    "The server's settings are unknown: it was not launched by perfdiag run --launch, so "
    "the run holds no launch arguments."
)
LAUNCH_ADVICE = (
    "Launch the server with perfdiag run --launch 'COMMAND' so the run records its "
    "arguments (or keep the server's command line and version beside the run)."
)


@fact("unpinned", provides=("missing", "pinned", "note", "server_advice"))
def unpinned(ctx: TriageContext) -> Fact:
    """How many of the things a reproduction needs the run does not record: versions,
    hardware, code revision, engine configuration, workload and its seed (against a
    server: its version and launch arguments instead of engine_ref's configuration)."""
    m = ctx.run.manifest
    server = _against_server(m)
    pins = _SERVER_PINS if server else _PINS
    kind = None if server else applicability.trace_kind(ctx.run)
    if kind is not None:  # a bare trace holds no engine or workload: none to record
        pins = {k: v for k, v in pins.items() if k not in applicability.SERVING_PINS}
    missing = [name for name, get in pins.items() if get(m) in (None, "", {}, [])]
    pinned = [name for name in pins if name not in missing]
    evidence = (
        ev("missing", "not recorded", ", ".join(missing) or "none"),
        ev("pinned", "recorded", ", ".join(pinned) or "none"),
    )
    if server and "server launch arguments" in missing:
        evidence += (ev("note", "why", NOT_LAUNCHED), ev("server_advice", "advice", LAUNCH_ADVICE))
    tables = m.tables or {}
    served = any((tables.get(t) or {}).get("rows", 0) for t in ("requests", "steps"))
    # A bare trace (no requests, no engine steps) cannot record an engine's configuration
    # or workload: what it lacks is worth knowing, never a cause that outranks one.
    return Fact(
        len(missing),
        evidence,
        impact=len(missing) / len(pins),
        max_severity=None if served else "info",
    )


_SPREAD = (
    ("ttft_p50", "TTFT p50", lambda m: m.ttft_s.p50),
    ("ttft_p99", "TTFT p99", lambda m: m.ttft_s.p99),
    ("itl_p50", "ITL p50", lambda m: m.itl_per_chunk_s.p50),
    ("itl_p99", "ITL p99", lambda m: m.itl_per_chunk_s.p99),
    ("throughput", "output tokens/s", lambda m: m.throughput.output_tokens_per_s),
)


@fact("repeat_spread", provides=("runs", *(f"{k}_spread" for k, _, _ in _SPREAD)))
def repeat_spread(ctx: TriageContext) -> Fact | Unavailable:
    """Across repeated runs of one configuration: the largest relative spread
    ((max − min) / median) of TTFT, ITL and throughput — the noise level a difference
    between two runs must beat."""
    if not ctx.repeats:
        return Unavailable("no repeated runs given (perfdiag analyze RUN --repeat OTHER …)")
    all_metrics = [c.get("metrics") for c in (ctx, *ctx.repeats)]
    if any(m is None for m in all_metrics):
        return Unavailable("a repeated run has no serving metrics")
    evidence = [ev("runs", "runs", len(all_metrics))]
    spreads = []
    for key, label, get in _SPREAD:
        values = np.array([get(m) for m in all_metrics], dtype=float)
        values = values[np.isfinite(values)]
        med = float(np.median(values)) if len(values) else float("nan")
        spread = float((values.max() - values.min()) / med) if len(values) > 1 and med else np.nan
        evidence.append(ev(f"{key}_spread", f"{label} spread", spread, "%"))
        if np.isfinite(spread):
            spreads.append(spread)
    value = max(spreads) if spreads else float("nan")
    return Fact(value, tuple(evidence), impact=min(1.0, value if finite(value) else 0.0))


@fact("repeat_differences", provides=("differences",))
def repeat_differences(ctx: TriageContext) -> Fact | Unavailable:
    """How many configuration or environment settings differ between the run and the
    runs given as its repeats (a repeat must change nothing)."""
    if not ctx.repeats:
        return Unavailable("no repeated runs given (perfdiag analyze RUN --repeat OTHER …)")
    from ..analyzers.compare import config_diff

    names: list[str] = []
    for other in ctx.repeats:
        diff = config_diff(ctx.run.manifest, other.run.manifest, ctx.get("host"), other.get("host"))
        names += [c.name for c in diff.changes if c.name not in names]
    return Fact(
        len(names), (ev("differences", "settings that differ", ", ".join(names) or "none"),)
    )


@fact("measured_requests", provides=("requests", "window_s"))
def measured_requests(ctx: TriageContext) -> Fact | Unavailable:
    """Requests measured in the analysis window: with few, tail percentiles are noise."""
    m = ctx.get("metrics")
    if m is None:
        return ctx.missing("metrics")
    n = m.outcomes.requests
    evidence = (
        ev("requests", "measured requests", n),
        ev("window_s", "window", m.window.duration_s, "s"),
    )
    return Fact(n, evidence)
