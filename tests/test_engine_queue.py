"""The engine queue over time (analyzers/engine_queue.py) is what TTFT's queue part is
made of: on a real uncapped run, where the steps' `num_waiting` (taken after scheduling)
reads 0 at every step, the curve's area equals the summed queue part, and the load
figure draws that curve (it drew the flat gauge before)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from perfdiag import load_run
from perfdiag.analyzers.engine_queue import engine_queue
from perfdiag.analyzers.lifecycle import build_lifecycle
from perfdiag.analyzers.steptime import StepTimeline
from perfdiag.analyzers.ttft import decompose_ttft
from perfdiag.playbooks.facts import TriageContext
from perfdiag.playbooks.figure_data import figure_data

# Uncapped open loop at a rate the tiny engine cannot quite take: requests queue in the
# engine's inbox while steps run.
RUN = ("run", "--preset", "tiny", "--prompt-len", "uniform:8:64", "--output-len", "uniform:4:12",
       "--no-device-sampling", "-q", "-n", "24", "--rate", "200")  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("queue") / "run"
    cmd = [sys.executable, "-m", "perfdiag", *RUN, "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    return load_run(out)


def area(frame, column: str) -> float:
    t, y = frame.iloc[:, 0].to_numpy(np.float64), frame[column].to_numpy(np.float64)
    return float((y[:-1] * np.diff(t)).sum())


def test_queue_area_is_ttft_queue_part(run):
    lc = build_lifecycle(run)
    steps = StepTimeline.from_run(run, lc.origin_ns)
    parts = decompose_ttft(lc, steps, np.ones(len(lc.requests), dtype=bool))
    q = engine_queue(lc, steps)
    queued_s = parts.per_request["queue_s"].sum()
    assert queued_s > 0, "the run should queue; raise the rate"
    assert area(q, "queued") / 1e9 == pytest.approx(queued_s, rel=1e-9, abs=1e-9)
    assert q["queued"].min() >= 0
    assert q["queued"].iloc[-1] == 0  # everyone was admitted in the end


def test_load_figure_draws_the_queue_the_gauge_misses(run, tmp_path):
    ctx = TriageContext(run)
    d = figure_data(ctx)
    assert d.waiting["waiting"].max() == 0  # the gauge after scheduling: flat at 0
    assert d.queue["queued"].max() >= 1
    # The figure data's time axis is the lifecycle's: in flight and queue start together.
    assert d.queue["t_s"].min() >= 0 and d.in_flight["t_s"].min() >= 0
    from perfdiag.playbooks.figures import draw

    fig = draw("load", ctx, tmp_path)
    assert fig is not None and fig.stat().st_size > 0


def test_queue_of_a_run_without_engine_events_is_empty(sample_run):
    path, _ = sample_run
    from perfdiag.analyzers.engine_queue import engine_queue_of_run

    q = engine_queue_of_run(load_run(path))
    assert list(q.columns) == ["ts_ns", "queued"]
