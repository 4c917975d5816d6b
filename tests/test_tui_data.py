"""The explorer's view models, without Textual: what each screen is built from, on the
hand-built demo run (tests/data/tui_runs.py), whose numbers follow from its schedule."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import tui_runs

from perfdiag import load_run
from perfdiag.playbooks.triage_view import step_status
from perfdiag.tui import fmt, query
from perfdiag.tui.data import RunData, identity
from perfdiag.tui.data_load import load_series
from perfdiag.tui.data_requests import request_detail, requests_frame
from perfdiag.tui.data_resources import build_lanes, window_breakdown
from perfdiag.tui.data_steps import SpanIndex, recorded_work, step_detail, steps_frame


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    path = tui_runs.demo(tmp_path_factory.mktemp("tui") / "demo-a")
    return RunData(load_run(path), ceilings_dir=path / "no-ceilings").analyse()


def test_identity_names_command_config_and_environment(demo):
    ident = identity(demo.run)
    rows = dict(ident.rows)
    assert ident.run_id == "demo-a" and ident.status == "complete"
    assert rows["command"] == "perfdiag run --preset demo --chunk-size 128"
    assert "chunk_size=128" in rows["engine"] and "prefix_cache=on" in rows["engine"]
    assert rows["model"].startswith("llama 2 layers, hidden 256")
    assert "open 1000 req/s constant" in rows["workload"]
    assert "1× NVIDIA H100 80GB HBM3" in rows["environment"]
    assert "git 012345678" in rows["environment"]
    assert rows["recorded"] == "2026-11-30 10:00:00 UTC → 2026-11-30 10:00:01 UTC"


def test_progress_is_reported_stage_by_stage(tmp_path):
    path = tui_runs.demo(tmp_path / "r")
    seen = []
    data = RunData(load_run(path))
    assert not data.ready and data.metrics()[0].name == "steps"  # before analysis
    data.analyse(lambda stage, done: seen.append((stage, done)))
    assert [s for s, _ in seen] == ["serving analyses", "triage", "ready"]
    assert [d for _, d in seen] == sorted(d for _, d in seen) and seen[-1][1] == 1.0
    assert data.ready


def test_findings_and_step_statuses(demo):
    checks = [f.check for f in demo.findings()]
    assert checks[:4] == ["few-requests", "host-bound", "over-capacity", "queue-dominates-ttft"]
    status = {s.step: (s.status, s.worst) for s in demo.steps()}
    # a warning or critical finding fires a step (styled by the worst); a step some of
    # whose checks could not run is partial, one none of whose checks could run is
    # not evaluated; an info finding never fires a step (step 5)
    assert status == {0: ("partial", None), 1: ("fired", "warning"), 2: ("fired", "critical"),
                      3: ("fired", "warning"), 4: ("fired", "critical"), 5: ("partial", "info"),
                      6: ("not-evaluated", None), 7: ("partial", None)}  # fmt: skip
    five = demo.view.step(5)
    assert five.counts.text() == "0 passed, 1 fired (1 info), 3 not evaluated"
    six = demo.view.step(6)
    assert six.not_evaluated[0][1] == ("several-variables",)
    step4 = next(s for s in demo.triage.steps if s.step == 4)
    assert step_status(step4.checks) == "fired"
    evaluated = [c for c in step4.checks if c.status == "passed"]
    assert step_status(evaluated) == "pass" and step_status(()) == "not-evaluated"


def test_key_metrics(demo):
    m = {e.name: e for e in demo.metrics()}
    assert m["requests"].value == "11 / 0 / 0"  # 12 requests, one warm-up
    assert m["ttft"].value.startswith(fmt.ms(demo.serving.metrics.ttft_s.p50))
    assert m["steps"].value == 16


def test_requests_frame_and_one_request(demo):
    frame = requests_frame(demo)
    assert len(frame) == 12 and set(frame["outcome"]) == {"ok"}
    r11 = frame.set_index("request_id").loc["req-11"]
    assert r11["prompt"] == 20 and r11["output"] == 8
    assert r11["ttft_ms"] == pytest.approx(11.54)  # sent 12 ms, first chunk 23.54 ms
    d = request_detail(demo, "req-11", frame)
    kinds = [s.kind for s in d.segments]
    assert kinds[:3] == ["input", "queue", "prefill"] and kinds.count("decode") == 7
    queue = d.segments[1]
    assert queue.start_ms == pytest.approx(0.4) and queue.end_ms == pytest.approx(9.728)
    assert len(d.deliveries_ms) == 8  # one chunk per token
    assert list(d.steps["role"])[:2] == ["prefill 20 tok", "decode"]
    # the TTFT parts add up to the TTFT
    assert sum(d.ttft_parts.values()) == pytest.approx(r11["ttft_ms"] / 1e3, rel=1e-6)
    assert request_detail(demo, "nope", frame) is None


def test_steps_frame_and_one_step(demo):
    frame = steps_frame(demo)
    assert len(frame) == 16
    assert list(frame["kind"][:3]) == ["prefill", "mixed", "mixed"]
    assert frame["host_after_ms"].iloc[0] == pytest.approx(0.9)
    assert np.isnan(frame["host_after_ms"].iloc[-1])
    assert set(frame["bound"]) <= {"compute", "bandwidth", "latency"}
    d = step_detail(demo, SpanIndex(demo), 3, frame)
    assert list(d.phases["name"]) == ["schedule", "prepare_inputs", "forward", "sample",
                                      "post_process"]  # fmt: skip
    kernels = d.work[d.work["category"] == "kernel"]
    assert list(kernels["name"]) == ["gemm_qkv", "flash_attn_fwd", "rms_norm", "gemm_mlp"]
    assert kernels["pct_of_roof"].notna().all() and (kernels["bound"] != "").all()
    assert d.roofline is not None and d.roofline["step_id"] == 3
    launches = d.work[d.work["category"] == "cuda_runtime"]
    assert launches["intensity"].isna().all()  # no FLOPs recorded: no position
    assert step_detail(demo, SpanIndex(demo), 999, frame) is None
    # per step: 4 launches + 4 kernels recorded; GPU time = the kernels'
    work = recorded_work(SpanIndex(demo), [3, 999])
    assert work[3] == (8, int(kernels["dur_us"].sum() * 1e3)) and work[999] == (0, 0)


def test_load_series(demo):
    s = load_series(demo)
    # every send falls in one bin: offered rates integrate back to the 12 sends
    assert (s.offered * s.bin_s).sum() == pytest.approx(12)
    assert (s.planned * s.bin_s).sum() == pytest.approx(12)
    assert s.target_rps == 1000.0
    assert np.nanmax(s.late_ms) == pytest.approx(0.1)
    assert np.nanmax(s.in_flight) <= demo.serving.load.in_flight.peak_run


def test_lanes_and_window_breakdown(demo):
    lanes = build_lanes(demo)
    names = [ln.name for ln in lanes.lanes]
    assert names == ["engine steps", "gpu0 s7", "tid 1", "GPU idle cause"]
    steps = lanes.lanes[0]
    share, chars = steps.cells(lanes.lo, lanes.hi, 40)
    assert set(chars) <= {"P", "M", "D", "·", " "} and chars[0] == "P"
    gpu = lanes.lanes[1]
    share, _ = gpu.cells(lanes.lo, lanes.hi, 1)
    assert share[0] == pytest.approx(gpu.busy_ns / (lanes.hi - lanes.lo))
    b = window_breakdown(demo, lanes.lo, lanes.hi)
    assert sum(b.values()) == lanes.hi - lanes.lo  # every instant counted once
    assert b["kernel"] == gpu.busy_ns


def test_query_language():
    frame = pd.DataFrame(
        {
            "request_id": ["req-1", "req-2", "other"],
            "outcome": ["ok", "error", "ok"],
            "ttft_ms": [5.0, np.nan, 150.0],
        }
    )
    assert list(query.mask(frame, "", "request_id")) == [True, True, True]
    assert list(query.mask(frame, "REQ", "request_id")) == [True, True, False]
    assert list(query.mask(frame, "outcome=error", "request_id")) == [False, True, False]
    assert list(query.mask(frame, "outcome!=error ttft>100", "request_id")) == [False, False, True]
    with pytest.raises(ValueError, match="no column"):
        query.mask(frame, "latency>3", "request_id")
    with pytest.raises(ValueError, match="is a number"):
        query.mask(frame, "ttft>fast", "request_id")
    with pytest.raises(ValueError, match="use = or !="):
        query.mask(frame, "outcome>ok", "request_id")
    assert list(query.order(frame, "ttft_ms", True)) == [2, 0, 1]  # missing last
    assert list(query.order(frame, "ttft_ms", False)) == [0, 2, 1]


def test_formats():
    assert fmt.ms(0.0123) == "12.3 ms" and fmt.ms(float("nan")) == "–"
    assert fmt.pct(0.42) == "42%" and fmt.pct(0.042) == "4.2%"
    assert fmt.si(1.5e12, "FLOP/s") == "1.5 TFLOP/s"
    assert fmt.duration(2e-6) == "2 µs" and fmt.num(12345) == "12,345"
    assert fmt.clip("abcdef", 4) == "abc…"


def test_data_layer_does_not_import_textual():
    code = ("import sys, perfdiag.tui.data, perfdiag.tui.data_requests, perfdiag.tui.data_steps, "
            "perfdiag.tui.data_load, perfdiag.tui.data_resources, perfdiag.tui.query\n"
            "print('textual' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
