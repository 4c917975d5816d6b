"""Overlapped scheduling in analysis: exposed vs hidden host time per step
(analyzers/host_overlap.py), the overlap-off fact's per-device prediction, host-bound
counting exposed host time only, and the --async-scheduling flag reaching the engine."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from perfdiag import load_run
from perfdiag.analyzers.host_overlap import host_overlap
from perfdiag.playbooks.facts import TriageContext, evaluate_fact

MS = 1_000_000


def _run(phases: dict[str, float], n: int = 4, gpu_ms: float | None = None):
    """n identical steps with the given phase durations (ms), back to back."""
    step = sum(v for k, v in phases.items() if k != "host_hidden") * MS
    steps = pd.DataFrame({
        "step_id": range(n),
        "start_ns": [i * int(step) for i in range(n)],
        "end_ns": [(i + 1) * int(step) for i in range(n)],
        "gpu_time_ns": pd.array([None if gpu_ms is None else int(gpu_ms * MS)] * n,
                                dtype="Int64"),
    })  # fmt: skip
    rows = [(name, "phase", i, int(ms * MS), None) for i in range(n) for name, ms in phases.items()]
    spans = pd.DataFrame(rows, columns=["name", "category", "step_id", "dur_ns", "rank"])
    return steps, spans


def test_plain_cpu_run_predicts_the_gain_per_device():
    steps, spans = _run({"schedule": 3.0, "prepare_inputs": 1.0, "forward": 2.5,
                         "sample": 0.5, "post_process": 1.0})  # fmt: skip
    o = host_overlap(steps, spans)
    assert not o.overlapped and o.device == "cpu"
    assert o.overlappable_ms == pytest.approx(4.0)
    assert o.exposed_ms == pytest.approx(5.0)
    assert o.predicted_gain_ms == {"cuda": pytest.approx(2.5), "cpu": 0.0}  # capped by forward
    assert o.gain_here_ms == 0.0


def test_overlapped_cuda_run_counts_only_exposed_host_time():
    steps, spans = _run({"schedule": 0.1, "prepare_inputs": 0.2, "forward": 0.3,
                         "schedule_ahead": 2.0, "prepare_ahead": 1.0, "host_hidden": 2.5,
                         "sample": 3.0, "post_process": 1.0}, gpu_ms=5.0)  # fmt: skip
    o = host_overlap(steps, spans)
    assert o.overlapped and o.device == "cuda"
    assert o.hidden_ms == pytest.approx(2.5)
    assert o.exposed_ms == pytest.approx(0.1 + 0.2 + 1.0 + 3.0 - 2.5)
    assert o.predicted_gain_ms["cuda"] == 0.0  # already overlapped


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name, extra in (("plain", []), ("overlap", ["--async-scheduling"])):
        d = tmp_path_factory.mktemp(name) / "run"
        subprocess.run([sys.executable, "-m", "perfdiag", "run", "--preset", "tiny",
                        "--requests", "12", "--quiet", "-o", str(d), *extra],
                       check=True, capture_output=True)  # fmt: skip
        out[name] = load_run(d)
    return out


def test_flag_reaches_the_engine_and_the_fact(runs):
    on, off = runs["overlap"], runs["plain"]
    assert on.manifest.config["run_options"]["engine"]["async_scheduling"] is True
    names = set(on.spans["name"].astype(str))
    assert {"schedule_ahead", "prepare_ahead"} <= names and "host_hidden" not in names
    assert evaluate_fact("overlap_off", TriageContext(on), {}).reason.startswith("overlapped")
    fact = evaluate_fact("overlap_off", TriageContext(off), {})
    values = fact.values()
    assert values["device"] == "cpu" and values["gain_here_ms"] == 0.0
    assert values["gain_cuda_ms"] > 0
    assert fact.action.settings[0].flag == "--async-scheduling"
    assert "hides nothing" in values["advice"]


def test_async_scheduling_with_speculative_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "perfdiag", "run", "--preset", "tiny",
                        "--requests", "2", "--async-scheduling", "--speculative", "ngram:4",
                        "-o", str(tmp_path / "r")], capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "--async-scheduling" in r.stderr
