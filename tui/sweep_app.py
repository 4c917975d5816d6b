"""`perfdiag tui SWEEP`: a sweep's curves and points; enter opens a point's run in the
run explorer (every screen of it), escape returns to the sweep."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..errors import ConfigError
from ..sweeps.spec import show
from .app import PerfdiagApp


class SweepData:
    """A sweep directory as the screen reads it: spec, points, runs, summary."""

    def __init__(self, path: Path) -> None:
        import json

        from ..sweeps.runner import RESULTS, RUNS, load_sweep

        self.path = Path(path)
        data, self.points, self.runs = load_sweep(self.path)
        self.spec = data["spec"]
        self.axes = list(self.spec.get("vary", {}))
        if not self.axes:
            raise ConfigError(f"{path}: the sweep names no axis")
        self.axis = self.axes[0]
        self.axis_label = self.axis.replace("_", "-")
        summary = self.path / RESULTS / "summary.json"
        self.series = json.loads(summary.read_text())["series"] if summary.exists() else []
        self.runs_dir = self.path / RUNS
        if self.points.empty:
            self.points = pd.DataFrame(columns=[*self.axes, "repeats"])

    def describe(self) -> str:
        repeats = self.spec.get("repeats", 1)
        return f"{len(self.points)} points × {repeats} repeat(s)"

    def summary_lines(self) -> list[str]:
        return [s["text"] for s in self.series]

    def run_of(self, point_row: int) -> Path | None:
        """The first complete repeat of a point (by its row in the points table)."""
        if self.runs.empty:
            return None
        point = self.points.iloc[point_row]
        match = pd.Series(True, index=self.runs.index)
        for a in self.axes:
            match &= self.runs[a].map(show) == show(point[a])
        rows = self.runs[match & (self.runs["status"] == "complete")]
        return self.runs_dir / rows.iloc[0]["run"] if len(rows) else None


class SweepApp(PerfdiagApp):
    """The run explorer with a sweep's screen beneath: its runs open over it."""

    def __init__(self, sweep: SweepData, **kw) -> None:
        super().__init__([sweep.path], **kw)  # a placeholder source until a point opens
        self.sweep = sweep
        self.sources = []

    def on_mount(self, event) -> None:
        from .screens.sweep import SweepScreen

        event.prevent_default()  # not the run explorer's mount: no run is open yet
        self.push_screen(SweepScreen(self.sweep))

    def open_point(self, run_path: Path) -> None:
        from .screens.overview import OverviewScreen

        self.sources = [run_path]
        try:
            self.datasets = [self._open(run_path, "A")]
        except Exception as e:  # a point's run that cannot be read: say so, stay here
            self.notify(f"cannot open {run_path.name}: {e}", severity="error")
            return
        self.current, self.comparison, self.progress = 0, None, ("opening", 0.0)
        self.push_screen(OverviewScreen(self.data))
        self.run_worker(self._analyse, thread=True, exclusive=True, name="analyse")

    def action_open(self, name: str) -> None:
        if self.datasets and len(self.screen_stack) > 2:
            super().action_open(name)

    def action_overview(self) -> None:
        while len(self.screen_stack) > 3:  # default, sweep, the run's overview
            self.pop_screen()


def make_sweep_app(path: Path, *, slo=None, steady: bool = True) -> SweepApp:
    return SweepApp(SweepData(path), slo=slo, steady=steady)
