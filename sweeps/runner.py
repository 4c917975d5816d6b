"""Run a sweep into its directory, resumably.

    SWEEP/sweep.json                 the spec (a rerun with another spec is refused)
    SWEEP/runs/p003-rate=4-r1/       every repeat of every point: a normal run
    SWEEP/runs/.incomplete/…         runs cut short by an interruption (kept, not counted)
    SWEEP/results/points.{parquet,csv} one row per point, intervals included
    SWEEP/results/runs.{parquet,csv}   one row per recorded repeat
    SWEEP/results/summary.{md,json}    the knee and the causes on either side of it
    SWEEP/results/*.png                the figures

Running the same command again continues where it stopped: complete runs are read back
(and analysed again: cheap), a run that was cut short is moved aside and recorded anew.
Tables are rewritten after every point, so Ctrl-C keeps every finished point.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .._version import __version__
from ..analyzers.slo import parse_slo
from ..errors import ConfigError
from ..traces.atomic_file import write_atomic
from ..traces.manifest import COMPLETE
from .measure import Measured, analyse, record, triage_point
from .spec import Point, SweepSpec, show

SPEC_FILE = "sweep.json"
RUNS = "runs"
RESULTS = "results"
INCOMPLETE = ".incomplete"


@dataclass
class SweepProgress:
    total_runs: int
    done_runs: int = 0
    point: str = ""
    repeat: int = 0
    requests_done: int = 0
    requests_total: int = 0
    recorded_s: list[float] = field(default_factory=list)  # durations of runs recorded now

    @property
    def eta_s(self) -> float | None:
        """Time left: the mean duration of the runs recorded so far × the runs left."""
        if not self.recorded_s:
            return None
        mean = sum(self.recorded_s) / len(self.recorded_s)
        return mean * (self.total_runs - self.done_runs)


@dataclass
class SweepResult:
    path: Path
    table: pd.DataFrame
    summaries: list
    figures: list[str]
    complete: bool


class SweepInterrupted(Exception):
    def __init__(self, result: SweepResult, done: int, total: int):
        super().__init__(f"{done} of {total} runs finished")
        self.result, self.done, self.total = result, done, total


def validate(spec: SweepSpec) -> list[tuple[Point, Any, Any]]:
    """Every point's run options, built now so a bad value fails before anything runs."""
    from ..probes.run_flag_options import build_options

    out = []
    for point in spec.points():
        try:
            options, http = build_options(spec.flags_of(point))
            if http is None:
                options.engine.engine_config()
        except ConfigError as e:
            raise ConfigError(f"point {point.label}: {e}") from None
        out.append((point, options, http))
    return out


def arrival_seconds(plans) -> float | None:
    """A lower bound on the sweep's duration: the open-loop points' arrival schedules
    (requests / rate each); None when a point is a closed loop (its pace is the engine's)."""
    total = 0.0
    for _, options, _ in plans:
        a = options.workload.arrival
        if a.mode != "open" or not a.rate:
            return None
        total += options.workload.requests / a.rate
    return total


def open_directory(spec: SweepSpec, out_dir: Path) -> bool:
    """Create the sweep directory, or check it holds this sweep. True when resuming."""
    spec_path = out_dir / SPEC_FILE
    if spec_path.exists():
        try:
            recorded = json.loads(spec_path.read_text()).get("spec")
        except (OSError, ValueError) as e:
            raise ConfigError(f"{spec_path}: unreadable ({e})") from None
        if recorded != spec.to_dict():
            raise ConfigError(f"{out_dir} holds another sweep (its {SPEC_FILE} differs); "
                              "give another --out, or the same flags to continue it")  # fmt: skip
        return True
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ConfigError(f"{out_dir}: already exists and is not a sweep directory")
    try:
        (out_dir / RUNS).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{out_dir}: cannot create the sweep directory ({e.strerror})") from None
    data = {"perfdiag": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "spec": spec.to_dict()}  # fmt: skip
    _write_text(spec_path, json.dumps(data, indent=2) + "\n")
    return False


def run_sweep(
    spec: SweepSpec,
    out_dir: Path,
    on_progress: Callable[[SweepProgress], None] | None = None,
    knee_metric: str | None = None,
    plans: list | None = None,
) -> SweepResult:
    """`plans`: validate(spec)'s result, when the caller already built it."""
    plans = plans if plans is not None else validate(spec)
    open_directory(spec, out_dir)
    slo = parse_slo(spec.slo) if spec.slo else None
    progress = SweepProgress(total_runs=len(plans) * spec.repeats)
    finished: list[tuple[dict[str, Any], list[Measured]]] = []

    def report() -> None:
        if on_progress is not None:
            on_progress(progress)

    try:
        for point, options, http in plans:
            repeats = []
            for r in range(spec.repeats):
                progress.point, progress.repeat = point.label, r
                progress.requests_done, progress.requests_total = 0, options.workload.requests
                report()
                run_dir = out_dir / RUNS / point.run_name(r)
                if not _complete(run_dir):
                    _move_aside(run_dir)
                    started = time.monotonic()

                    def step(p) -> None:
                        progress.requests_done = p.done
                        report()

                    record(options, http, run_dir, on_progress=step)
                    progress.recorded_s.append(time.monotonic() - started)
                repeats.append(analyse(run_dir, slo))
                progress.done_runs += 1
                report()
            triage_point(repeats)
            finished.append((dict(point.values), repeats))
            write_tables(spec, out_dir, finished, final=False)
    except KeyboardInterrupt:
        result = write_tables(spec, out_dir, finished, True, knee_metric)
        raise SweepInterrupted(result, progress.done_runs, progress.total_runs) from None
    return write_tables(spec, out_dir, finished, True, knee_metric)


def write_tables(
    spec: SweepSpec, out_dir: Path, finished, final: bool, knee_metric: str | None = None
) -> SweepResult:
    """The tables after every point; the summary and figures at the end (or on Ctrl-C)."""
    from . import summary as summary_mod
    from .table import points_table, runs_table

    results = out_dir / RESULTS
    results.mkdir(parents=True, exist_ok=True)
    table = points_table(finished)
    runs = runs_table(finished)
    for name, frame in (("points", table), ("runs", runs)):
        frame = _plain(frame)
        frame.to_parquet(results / f"{name}.parquet.tmp", index=False)
        os.replace(results / f"{name}.parquet.tmp", results / f"{name}.parquet")
        _write_text(results / f"{name}.csv", frame.to_csv(index=False))
    summaries, figures = [], []
    if final and not table.empty:
        from .plots import draw_all

        summaries = summary_mod.summarise(spec, table, knee_metric)
        figures = draw_all(spec, table, summaries, results, runs)
        _write_text(results / "summary.md",
                    summary_mod.markdown(spec, table, summaries, figures) + "\n")  # fmt: skip
        data = {"spec": spec.to_dict(), "points": len(table),
                "series": summary_mod.to_jsonable(summaries)}  # fmt: skip
        _write_text(results / "summary.json", json.dumps(data, indent=2, allow_nan=False) + "\n")
    complete = len(finished) == len(spec.points())
    return SweepResult(out_dir, table, summaries, figures, complete)


def _plain(frame: pd.DataFrame) -> pd.DataFrame:
    """Axis values of mixed kinds (a chunk size or `off`) as text, so Parquet takes them."""
    frame = frame.copy()
    for c in frame.columns:
        if frame[c].dtype == object:
            frame[c] = frame[c].map(lambda v: v if isinstance(v, str) else show(v))
    return frame


def _complete(run_dir: Path) -> bool:
    from ..traces.manifest import read_manifest

    if not (run_dir / "manifest.json").exists():
        return False
    try:
        return read_manifest(run_dir).status == COMPLETE
    except Exception:  # an unreadable manifest: record the run again
        return False


def _move_aside(run_dir: Path) -> None:
    """A run cut short (or a failed start) is kept under runs/.incomplete, not reused."""
    if not run_dir.exists():
        return
    aside = run_dir.parent / INCOMPLETE
    aside.mkdir(exist_ok=True)
    n = 0
    while (aside / f"{run_dir.name}-{n}").exists():
        n += 1
    os.replace(run_dir, aside / f"{run_dir.name}-{n}")


def _write_text(path: Path, text: str) -> None:
    write_atomic(path, text)  # fsynced: a crash never leaves a half-written summary


def load_sweep(path: Path) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """A sweep directory's spec, points table and runs table (for the TUI)."""
    spec_path = Path(path) / SPEC_FILE
    if not spec_path.exists():
        raise ConfigError(f"{path}: not a sweep directory (no {SPEC_FILE})")
    try:
        data = json.loads(spec_path.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("spec"), dict):
            raise ValueError("no spec in it")
    except (OSError, ValueError) as e:
        raise ConfigError(f"{spec_path}: not a sweep's {SPEC_FILE} ({e})") from None
    results = Path(path) / RESULTS

    def read(name: str) -> pd.DataFrame:
        f = results / f"{name}.parquet"
        if not f.exists():
            return pd.DataFrame()
        try:
            return pd.read_parquet(f)
        except (OSError, ValueError) as e:  # pyarrow's errors are both
            raise ConfigError(f"{f}: unreadable ({e})") from None

    return data, read("points"), read("runs")
