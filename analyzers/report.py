"""One call that runs every timeline analysis on a run: `timeline_report(run)`."""

from __future__ import annotations

from dataclasses import dataclass, fields

import pandas as pd

from ..traces.reader import Run
from . import gaps, kernels, timeline
from .spans import timeline_spans


@dataclass
class TimelineReport:
    windows: pd.DataFrame
    breakdown: pd.DataFrame
    outside: pd.DataFrame  # per rank: traced time outside the windows (between vLLM's steps)
    resources: pd.DataFrame
    overlap: pd.DataFrame
    launch_stats: pd.DataFrame
    gaps: pd.DataFrame
    gap_summary: pd.DataFrame
    kernel_classes: pd.DataFrame
    kernels: pd.DataFrame
    ops: pd.DataFrame
    kernels_linked: float  # fraction of kernels joined to their launch call
    gpu_ops: int
    spans: int

    def frames(self) -> dict[str, pd.DataFrame]:
        items = ((f.name, getattr(self, f.name)) for f in fields(self))
        return {name: v for name, v in items if isinstance(v, pd.DataFrame)}


def timeline_report(run: Run) -> TimelineReport:
    df = timeline_spans(run)
    return report_from_spans(df, run.steps)


def report_from_spans(df: pd.DataFrame, steps: pd.DataFrame | None = None) -> TimelineReport:
    wins = timeline.windows(df, steps)
    joined = gaps.launch_join(df)
    idle = gaps.idle_gaps(df, joined)
    by_class, by_name = kernels.kernel_breakdown(df)
    return TimelineReport(
        windows=wins,
        breakdown=timeline.breakdown(df, wins),
        outside=timeline.outside_windows(df, wins),
        resources=timeline.resources(df, wins),
        overlap=timeline.overlap(df, wins),
        launch_stats=gaps.launch_stats(joined),
        gaps=idle,
        gap_summary=gaps.gap_summary(idle),
        kernel_classes=by_class,
        kernels=by_name,
        ops=kernels.op_breakdown(df),
        kernels_linked=gaps.linked_fraction(joined, "kernel"),
        gpu_ops=len(joined),
        spans=len(df),
    )
