"""What the report's figures show, as plain tables, for both renderers: report.md's PNGs
(figures.py, matplotlib) and the HTML report (html_report.py, plotly). Both draw from
here, so a PNG and its interactive twin cannot disagree, and both from the analyses the
findings were made of (the queue from the same milestones as TTFT's queue part, the
latency percentiles from the metrics' own distributions).

Times on every time axis are seconds from one origin: the lifecycle's (the run's earliest
request event or step).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pandas as pd

NS = 1e9
LATENCIES = (  # name, the metrics' Dist field, the per-request column (None: the gaps)
    ("TTFT", "ttft_s", "ttft_s"),
    ("TPOT", "tpot_s", "tpot_s"),
    ("ITL (per chunk)", "itl_per_chunk_s", None),
    ("E2E", "e2e_s", "e2e_s"),
)


@dataclass(frozen=True)
class Interval:
    start_s: float
    end_s: float
    label: str


@dataclass(frozen=True)
class Latency:
    name: str
    ms: np.ndarray  # every measured value
    p50_ms: float  # the metrics' percentiles, as the findings quote them
    p99_ms: float


def figure_data(ctx) -> FigureData:
    """The figures' data for a triage context, computed once per context."""
    return ctx.memo.setdefault("figure_data", FigureData(ctx))


class FigureData:
    def __init__(self, ctx) -> None:
        self.ctx = ctx

    @cached_property
    def lifecycle(self):
        from ..analyzers.lifecycle import Missing, build_lifecycle

        lc = build_lifecycle(self.ctx.run)
        return None if isinstance(lc, Missing) else lc

    @cached_property
    def origin_ns(self) -> int:
        if self.lifecycle is not None:
            return int(self.lifecycle.origin_ns)
        steps = self.ctx.run.steps
        return int(steps["start_ns"].min()) if len(steps) else 0

    def seconds(self, ns) -> np.ndarray:
        return (np.asarray(ns, dtype=np.int64) - self.origin_ns) / NS

    @cached_property
    def in_flight(self) -> pd.DataFrame:
        """t_s, in_flight: requests the client had sent and not yet finished."""
        load = self.ctx.get("load")
        if load is None or not len(load.in_flight.curve):
            return pd.DataFrame({"t_s": [], "in_flight": []})
        c = load.in_flight.curve
        return pd.DataFrame({"t_s": self.seconds(c["ts_ns"]), "in_flight": c["in_flight"]})

    @cached_property
    def queue(self) -> pd.DataFrame:
        """t_s, queued: requests in the engine not yet running (analyzers/engine_queue.py:
        inbox and waiting queue, the intervals of TTFT's queue part)."""
        from ..analyzers.engine_queue import engine_queue
        from ..analyzers.steptime import StepTimeline

        if self.lifecycle is None:
            return pd.DataFrame({"t_s": [], "queued": []})
        steps = StepTimeline.from_run(self.ctx.run, self.origin_ns)
        q = engine_queue(self.lifecycle, steps)
        return pd.DataFrame({"t_s": self.seconds(q["ts_ns"]), "queued": q["queued"]})

    @cached_property
    def stalls(self) -> tuple[Interval, ...]:
        """Where a probe held the engine (profiler start/stop, …)."""
        sp = self.ctx.run.spans
        if not len(sp):
            return ()
        p = sp[(sp["category"] == "probe").to_numpy()]
        start = self.seconds(p["start_ns"])
        dur = p["dur_ns"].to_numpy(np.float64) / NS
        return tuple(
            Interval(float(a), float(a + d), f"{n} {d:.2f} s")
            for a, d, n in zip(start, dur, p["name"].astype(str), strict=True)
        )

    @cached_property
    def profiler_window(self) -> Interval | None:
        """The steps torch.profiler captured, from the first's start to the last's end."""
        ps = self.ctx.get("probe_stalls")
        steps = self.ctx.run.steps
        if ps is None or ps.window_steps is None or not len(steps):
            return None
        lo, hi = ps.window_steps
        inside = steps[steps["step_id"].between(lo, hi).to_numpy()]
        if not len(inside):
            return None
        a = float(self.seconds([inside["start_ns"].min()])[0])
        b = float(self.seconds([inside["end_ns"].max()])[0])
        return Interval(a, b, f"profiler window (steps {lo}–{hi})")

    @cached_property
    def steps(self) -> pd.DataFrame:
        """step_id, t_s, dur_ms, kind (prefill | mixed | decode | idle), preempted."""
        comp = self.ctx.get("composition")
        steps = self.ctx.run.steps
        if comp is None or not len(steps):
            return pd.DataFrame(columns=["step_id", "t_s", "dur_ms", "kind", "preempted"])
        cols = steps[["step_id", "start_ns", "num_preempted"]].drop_duplicates("step_id")
        per = comp.per_step.merge(cols, on="step_id")
        return pd.DataFrame(
            {
                "step_id": per["step_id"].to_numpy(),
                "t_s": self.seconds(per["start_ns"]),
                "dur_ms": per["dur_s"].to_numpy(np.float64) * 1e3,
                "kind": per["kind"].astype(str).to_numpy(),
                "preempted": per["num_preempted"].fillna(0).to_numpy() > 0,
            }
        )

    @cached_property
    def waiting(self) -> pd.DataFrame:
        """t_s, waiting: the scheduler's waiting queue as each step recorded it (after
        scheduling: requests held back by a limit, not those in the inbox)."""
        steps = self.ctx.run.steps
        if not len(steps) or not steps["num_waiting"].notna().any():
            return pd.DataFrame({"t_s": [], "waiting": []})
        s = steps[steps["num_waiting"].notna().to_numpy()]
        return pd.DataFrame(
            {"t_s": self.seconds(s["start_ns"]), "waiting": s["num_waiting"].to_numpy(float)}
        )

    @cached_property
    def latencies(self) -> tuple[Latency, ...]:
        """The measured requests' (the metrics' window) TTFT, TPOT, ITL and E2E in ms."""
        m = self.ctx.get("metrics")
        if m is None:
            return ()
        pr = m.per_request
        sel = pr["in_window"].to_numpy(bool)
        out = []
        for name, field, column in LATENCIES:
            if column is None:
                g = m.gaps
                keep = sel[g["code"].to_numpy()] if len(g) else np.zeros(0, bool)
                values = g["gap_s"].to_numpy(np.float64)[keep]
            else:
                values = pr[column].to_numpy(np.float64)[sel]
            values = values[np.isfinite(values)] * 1e3
            dist = getattr(m, field)
            if len(values):
                out.append(Latency(name, values, _ms(dist.p50), _ms(dist.p99)))
        return tuple(out)

    @cached_property
    def roofline(self):
        """The run's roofline (analyzers/roofline.py) when it has per-step or per-span
        FLOPs and bytes; None otherwise."""
        from ..analyzers.roofline import roofline_report
        from ..errors import PerfdiagError

        try:
            roof = roofline_report(self.ctx.run)
        except PerfdiagError:
            return None
        return roof if len(roof.steps) or len(roof.spans) else None


def _ms(seconds) -> float:
    return float("nan") if seconds is None else float(seconds) * 1e3
