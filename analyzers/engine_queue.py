"""The engine queue over time, from the request events: how many requests had reached
the engine and were not yet running.

A request is queued from the milestone the TTFT decomposition calls the end of input
processing (tokenised, else queued, else its arrival) to the start of the step that first
schedules it, and again from a preemption to the start of the step that takes it back.
These are the intervals TTFT's `queue_s` part integrates (analyzers/ttft.py), so the
curve and that part agree by construction.

Why not the steps table's `num_waiting`: the engine takes it after scheduling, when the
inbox has just been drained into the batch. A request that arrives while a step runs
waits in the inbox for the rest of that step and is admitted by the next schedule, so it
is never counted there: under an uncapped load the gauge reads 0 at every step while
requests queue for hundreds of milliseconds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..traces.reader import Run
from .lifecycle import Lifecycle, Missing, build_lifecycle
from .steady_state import Concurrency
from .steptime import StepTimeline


def engine_queue(lc: Lifecycle, steps: StepTimeline | None) -> pd.DataFrame:
    """ts_ns (the run's clock), queued: a step function, `queued` holding from its row's
    time to the next row's. Empty when the run has no engine request events."""
    empty = pd.DataFrame({"ts_ns": pd.array([], dtype="int64"), "queued": np.zeros(0)})
    r = lc.requests
    if not lc.has_engine or not len(r):
        return empty
    q = _first_known(r, ("t_tokenize_end", "t_queued", "t_arrival"))
    admitted = _step_start(steps, r["step_first_sched"].to_numpy(), r["t_first_sched"].to_numpy())
    # Never admitted (aborted in the queue): queued until it finished, else to the end.
    admitted = np.where(np.isnan(admitted), r["t_finished"].to_numpy(), admitted)
    ok = ~np.isnan(q)
    start, end = [q[ok]], [np.maximum(admitted[ok], q[ok])]
    a, b = _requeued(lc, steps)
    start.append(a)
    end.append(b)
    curve = Concurrency.of(np.concatenate(start), np.concatenate(end))
    if not len(curve.t):
        return empty
    return pd.DataFrame(
        {"ts_ns": np.rint(curve.t).astype(np.int64) + lc.origin_ns, "queued": curve.count}
    )


def engine_queue_of_run(run: Run) -> pd.DataFrame:
    """`engine_queue` for a run read from disk."""
    lc = build_lifecycle(run)
    if isinstance(lc, Missing):
        return pd.DataFrame({"ts_ns": pd.array([], dtype="int64"), "queued": np.zeros(0)})
    return engine_queue(lc, StepTimeline.from_run(run, lc.origin_ns))


def _step_start(steps: StepTimeline | None, step_ids: np.ndarray, fallback: np.ndarray):
    """The start of each step (by id), as TTFT takes it; `fallback` where unknown."""
    if steps is None:
        return fallback.astype(np.float64)
    pos = steps.index_of(step_ids)
    return np.where(pos >= 0, steps.start[np.maximum(pos, 0)], fallback)


def _requeued(lc: Lifecycle, steps: StepTimeline | None) -> tuple[np.ndarray, np.ndarray]:
    """[preempted, start of the step that took it back] for every preemption."""
    e = lc.engine
    kind = e["kind"].to_numpy()
    pre = e[kind == "preempted"][["code", "t"]].sort_values("t")
    if not len(pre):
        return np.zeros(0), np.zeros(0)
    back = e[np.isin(kind, ("scheduled", "resumed")) & ~np.isnan(e["step"].to_numpy())]
    right = back[["code", "t", "step"]].sort_values("t").rename(columns={"t": "t_back"})
    joined = pd.merge_asof(pre, right, left_on="t", right_on="t_back", by="code",
                           direction="forward")  # fmt: skip
    a = joined["t"].to_numpy(np.float64)
    b = _step_start(steps, joined["step"].to_numpy(np.float64), joined["t_back"].to_numpy())
    return a, np.maximum(b, a)  # never taken back: NaN, queued to the end


def _first_known(frame: pd.DataFrame, columns) -> np.ndarray:
    out = frame[columns[0]].to_numpy(np.float64).copy()
    for col in columns[1:]:
        out = np.where(np.isnan(out), frame[col].to_numpy(np.float64), out)
    return out
