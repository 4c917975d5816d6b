"""Triage step 2: did the load arrive as asked, and is the system keeping up?

- offered vs target rate: the manifest's target, the rate the plan drew
  (scheduled_send) and the rate requests were actually sent; lateness = created −
  scheduled_send (the client waking late);
- back-pressure: under a concurrency cap a due request that finds the cap full waits
  for a slot (sent − created); the verdict fires when at least BLOCKED_SHARE of requests
  found it full, so the offered load fell below the target. Without a cap nothing is
  held back (short waits are the client's event loop); a run that does not say how it
  was driven is judged by its waits (UNCAPPED_WAIT_S);
- concurrency: requests in flight (client view), time-weighted mean and peak;
- Little's law three ways over the window: L measured on the client, λ·W, and the
  engine's running + waiting (+ swapped) after each step's scheduling;
- saturation: the engine's waiting queue regressed on time, and arrivals vs completions.
Every request counts here, warm-up included: it is load all the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .distribution import Dist
from .lifecycle import Lifecycle
from .steady_state import INTERNAL, Concurrency, Window, done_times
from .steptime import StepTimeline

NS = 1e9
LATE_S = 1e-3  # a send more than this after its schedule is late
WAIT_S = 1e-3  # waits longer than this are counted (waited_share)
BLOCKED_SHARE = 0.05
UNCAPPED_WAIT_S = 10e-3
LITTLE_TOLERANCE = 0.10
SATURATION_EXCESS = 0.10  # arrivals exceed completions by this fraction
MIN_QUEUE_GROWTH = 2.0  # requests the queue must gain over the window


@dataclass(frozen=True)
class OfferedLoad:
    mode: str | None  # open | closed (None: the run does not say)
    target_rate_rps: float | None
    planned_rate_rps: float  # the schedule drawn (scheduled_send), NaN in a closed loop
    offered_rate_rps: float  # requests actually sent per second (after any cap's wait)
    issued_rate_rps: float  # requests the client itself issued per second (before a cap)
    offered_vs_target: float
    # issued < 90% of planned: the client itself fell behind its schedule (a concurrency
    # cap holding requests back is back-pressure, not a late client)
    under_delivered: bool
    lateness_s: Dist
    late_share: float


@dataclass(frozen=True)
class BackPressure:
    concurrency_cap: int | None
    client_wait_s: Dist
    waited_share: float  # requests that waited more than WAIT_S to be sent
    blocked_share: float  # requests that found the cap full when due (NaN: no cap)
    blocked_wait_s: Dist  # their waits
    total_wait_s: float
    fired: bool


@dataclass(frozen=True)
class InFlight:
    mean: float  # time-weighted, over the window
    peak: int
    mean_run: float  # over the whole run
    peak_run: int
    curve: pd.DataFrame = field(metadata=INTERNAL)  # ts_ns, in_flight


@dataclass(frozen=True)
class LittlesLaw:
    window_s: float
    arrival_rate_rps: float  # λ: sends in the window per second
    mean_time_in_system_s: float  # W: send → done of those requests
    lambda_w: float
    client_in_flight: float  # L measured on the client
    engine_in_system: float  # L from the engine's queue depths (NaN: no steps)
    lambda_w_vs_client: float  # |λW − L| / L
    engine_vs_client: float  # |L_engine − L| / L
    agrees: bool  # λW within LITTLE_TOLERANCE of L


@dataclass(frozen=True)
class Saturation:
    arrival_rate_rps: float
    completion_rate_rps: float
    queue_slope_per_s: float  # growth of the engine's waiting queue (requests/s)
    queue_growth: float  # slope × window
    mean_waiting: float
    saturated: bool | None  # None: no queue depths to judge by


@dataclass(frozen=True)
class LoadChecks:
    offered: OfferedLoad
    back_pressure: BackPressure
    in_flight: InFlight
    littles_law: LittlesLaw
    saturation: Saturation


def load_checks(
    lc: Lifecycle, window: Window, steps: StepTimeline | None, arrival: dict
) -> LoadChecks:
    r = lc.requests
    sent, done = r["t_sent"].to_numpy(), done_times(r)
    curve = Concurrency.of(sent, done)
    a, b = window.t_start, window.t_end
    t0 = np.nanmin(sent) if (~np.isnan(sent)).any() else 0.0
    t_end = np.nanmax(np.concatenate((sent, done))) if len(sent) else 0.0
    in_flight = InFlight(
        mean=curve.mean(a, b),
        peak=curve.peak(a, b),
        mean_run=curve.mean(t0, t_end),
        peak_run=curve.peak(t0, t_end),
        curve=pd.DataFrame(
            {"ts_ns": curve.t.astype(np.int64) + lc.origin_ns, "in_flight": curve.count}
        ),
    )
    return LoadChecks(
        offered=_offered(r, arrival),
        back_pressure=_back_pressure(r, arrival, curve),
        in_flight=in_flight,
        littles_law=_little(lc, sent, done, curve, window, steps),
        saturation=_saturation(sent, done, window, steps),
    )


def _rate(t: np.ndarray) -> float:
    t = np.sort(t[~np.isnan(t)])
    return (len(t) - 1) / ((t[-1] - t[0]) / NS) if len(t) > 1 and t[-1] > t[0] else np.nan


def _offered(r: pd.DataFrame, arrival: dict) -> OfferedLoad:
    planned = _rate(r["t_scheduled_send"].to_numpy())
    sent = r["t_sent"].to_numpy()
    offered = _rate(sent)
    # When a request was issued: its creation, or its send where the run has no creation.
    issued = _rate(np.where(np.isnan(r["t_created"].to_numpy()), sent, r["t_created"].to_numpy()))
    target = arrival.get("rate")
    late = (r["t_created"].to_numpy() - r["t_scheduled_send"].to_numpy()) / NS
    late = late[~np.isnan(late)]
    return OfferedLoad(
        mode=arrival.get("mode"),
        target_rate_rps=None if target is None else float(target),
        planned_rate_rps=float(planned),
        offered_rate_rps=float(offered),
        issued_rate_rps=float(issued),
        offered_vs_target=float(offered / target) if target else float("nan"),
        under_delivered=bool(planned == planned and issued < 0.9 * planned),
        lateness_s=Dist.of(late),
        late_share=float((late > LATE_S).mean()) if len(late) else float("nan"),
    )


def _back_pressure(r: pd.DataFrame, arrival: dict, curve: Concurrency) -> BackPressure:
    created, sent = r["t_created"].to_numpy(), r["t_sent"].to_numpy()
    ok = ~np.isnan(created) & ~np.isnan(sent)
    wait = (sent[ok] - created[ok]) / NS
    cap = arrival.get("concurrency") if arrival.get("mode") == "open" else None
    waited = float((wait > WAIT_S).mean()) if len(wait) else float("nan")
    blocked = np.zeros(len(wait), dtype=bool)
    if cap is not None and len(curve.t):
        at = np.searchsorted(curve.t, created[ok], side="left") - 1  # just before it
        blocked = (at >= 0) & (curve.count[np.maximum(at, 0)] >= cap)
        fired = bool(blocked.mean() >= BLOCKED_SHARE)
    elif arrival.get("mode") in ("open", "closed"):
        fired = False  # no cap (or a closed loop): the client holds nothing back
    else:  # the run does not say how it was driven: judge by the waits alone
        fired = bool(len(wait) and (wait > UNCAPPED_WAIT_S).mean() >= BLOCKED_SHARE)
    return BackPressure(
        concurrency_cap=None if cap is None else int(cap),
        client_wait_s=Dist.of(wait),
        waited_share=waited,
        blocked_share=float(blocked.mean()) if cap is not None and len(wait) else float("nan"),
        blocked_wait_s=Dist.of(wait[blocked]),
        total_wait_s=float(wait.sum()),
        fired=fired,
    )


def _little(lc, sent, done, curve: Concurrency, window: Window, steps) -> LittlesLaw:
    a, b = window.t_start, window.t_end
    dur = (b - a) / NS
    inside = (sent >= a) & (sent <= b)
    lam = inside.sum() / dur if dur > 0 else np.nan
    times = (done - sent)[inside]
    w = float(np.nanmean(times) / NS) if (~np.isnan(times)).any() else np.nan
    big_l = curve.mean(a, b)
    engine = _engine_in_system(steps, lc, a, b) if steps is not None else np.nan
    lw = lam * w
    return LittlesLaw(
        window_s=dur,
        arrival_rate_rps=float(lam),
        mean_time_in_system_s=w,
        lambda_w=float(lw),
        client_in_flight=big_l,
        engine_in_system=float(engine),
        lambda_w_vs_client=_rel(lw, big_l),
        engine_vs_client=_rel(engine, big_l),
        agrees=bool(_rel(lw, big_l) <= LITTLE_TOLERANCE),
    )


def _engine_in_system(steps: StepTimeline, lc: Lifecycle, a: float, b: float) -> float:
    """Time-weighted running + waiting (+ swapped). A step's counts (taken after its
    scheduling) hold while it runs; in the gap after it, less the requests that finished
    in it — so an idle engine counts 0, with no guess at what a pause means."""
    value = steps.in_system
    if b <= a or len(steps) == 0 or np.isnan(value).all():
        return float("nan")
    e = lc.engine
    fin = e[(e["kind"] == "finished").to_numpy()]
    pos = steps.index_of(fin["step"].to_numpy())
    finished = np.bincount(pos[pos >= 0], minlength=len(steps)).astype(np.float64)
    start, end = steps.start, steps.end
    nxt = np.append(start[1:], max(end[-1], b))
    during = (np.clip(end, a, b) - np.clip(start, a, b)) * value
    after = (np.clip(nxt, a, b) - np.clip(end, a, b)) * np.maximum(value - finished, 0.0)
    ok = ~np.isnan(value)
    return float((during[ok] + after[ok]).sum() / (b - a))


def _saturation(sent, done, window: Window, steps) -> Saturation:
    a, b = window.t_start, window.t_end
    dur = (b - a) / NS
    arrivals = ((sent >= a) & (sent <= b)).sum() / dur if dur > 0 else np.nan
    completions = ((done >= a) & (done <= b)).sum() / dur if dur > 0 else np.nan
    slope = mean_waiting = np.nan
    if steps is not None:
        inside = (steps.start >= a) & (steps.start <= b) & ~np.isnan(steps.waiting)
        if inside.sum() >= 3:
            t = steps.start[inside] / NS
            slope = float(np.polyfit(t - t[0], steps.waiting[inside], 1)[0])
            mean_waiting = float(steps.waiting[inside].mean())
    growth = slope * dur
    saturated = None
    if slope == slope:
        excess = arrivals > (1 + SATURATION_EXCESS) * completions
        saturated = bool(excess and growth >= MIN_QUEUE_GROWTH)
    return Saturation(
        arrival_rate_rps=float(arrivals),
        completion_rate_rps=float(completions),
        queue_slope_per_s=float(slope),
        queue_growth=float(growth),
        mean_waiting=float(mean_waiting),
        saturated=saturated,
    )


def _rel(x: float, ref: float) -> float:
    return float(abs(x - ref) / ref) if ref and ref == ref and x == x else float("nan")
