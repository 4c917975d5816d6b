"""How well a load generator kept an open-loop constant-rate schedule, from arrival times alone.

Works for any view of one load: the client's own record (each send beside the time it
was due), or times another party saw (the server's receipt of each request, another
tool's requests) where the schedule is not known. There the ideal schedule is rebuilt:
arrivals i = 0, 1, … due at t0 + i / rate, t0 the latest start that leaves no arrival
early (min over i of t_i − i / rate) — so lateness is ≥ 0 and a constant transport delay
drops out. Pure numpy; times in integer nanoseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# A run fell behind when it offered less than this share of its target rate, or when its
# lateness grew over the run (last tenth's median minus first tenth's) by more than this
# many inter-arrival periods: the schedule slipped rather than jittered.
MIN_RATIO, MAX_DRIFT_PERIODS = 0.99, 2.0


@dataclass(frozen=True)
class ScheduleAccuracy:
    n: int
    target_rate: float  # req/s
    achieved_rate: float  # (n − 1) / (last − first arrival)
    ratio: float  # achieved / target
    lateness_p50_s: float
    lateness_p99_s: float
    lateness_max_s: float
    drift_s: float  # median lateness of the last tenth minus that of the first tenth
    fell_behind: bool
    basis: str  # schedule: against the recorded due times; rebuilt: from the rate alone


def schedule_accuracy(times_ns, target_rate: float, due_ns=None) -> ScheduleAccuracy:
    """Accuracy of arrivals `times_ns` against `target_rate` (and `due_ns` when known)."""
    t = np.asarray(times_ns, dtype=np.int64)
    if target_rate <= 0:
        raise ValueError("target_rate must be > 0")
    if len(t) < 2:
        raise ValueError("at least two arrivals are needed")
    if due_ns is not None:
        due = np.asarray(due_ns, dtype=np.int64)
        if due.shape != t.shape:
            raise ValueError("times_ns and due_ns differ in length")
        order = np.argsort(due, kind="stable")
        t, due = t[order], due[order]
        late = (t - due).astype(np.float64) / 1e9
        basis = "schedule"
    else:
        t = np.sort(t)
        ideal = np.arange(len(t), dtype=np.float64) / target_rate
        rel = (t - t[0]).astype(np.float64) / 1e9
        late = rel - ideal
        late -= late.min()
        basis = "rebuilt"
    span = (t.max() - t.min()) / 1e9
    achieved = (len(t) - 1) / span if span > 0 else float("inf")
    tenth = max(1, len(late) // 10)
    drift = float(np.median(late[-tenth:]) - np.median(late[:tenth]))
    ratio = achieved / target_rate
    behind = bool(ratio < MIN_RATIO or drift > MAX_DRIFT_PERIODS / target_rate)
    return ScheduleAccuracy(
        n=len(t),
        target_rate=float(target_rate),
        achieved_rate=float(achieved),
        ratio=float(ratio),
        lateness_p50_s=float(np.percentile(late, 50)),
        lateness_p99_s=float(np.percentile(late, 99)),
        lateness_max_s=float(late.max()),
        drift_s=drift,
        fell_behind=behind,
        basis=basis,
    )
