"""`perfdiag sweep` as a user runs it: a grid of real runs on engine_ref, Ctrl-C in the
middle of a point (the finished point is kept, the cut run moved aside), the same
command continuing the sweep, and the table, summary and figures at the end."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import pandas as pd

from perfdiag.traces.manifest import read_manifest

# Ctrl-C sent by the process to itself at step 5 of the second point's run: exact
# whatever the machine's speed.
SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from perfdiag.probes import recorder

    init, on_step, sent = recorder.RunRecorder.__init__, recorder.RunRecorder.on_step, []
    def _init(self, writer, *a, **k):
        init(self, writer, *a, **k)
        self._test_path = str(writer.path)
    def _on_step(self, e):
        on_step(self, e)
        if sys.argv[1] in self._test_path and e.step_id >= 5 and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)
    recorder.RunRecorder.__init__, recorder.RunRecorder.on_step = _init, _on_step
    from perfdiag.cli import main
    main(sys.argv[2:])
    """
)
SETS = ("preset=tiny", "requests=10", "warmup=0", "prompt-len=16", "output-len=4",
        "no-device-sampling=on")  # fmt: skip
BASE = [arg for s in SETS for arg in ("--set", s)]


def _sweep(out, *args, interrupt_at="never-matches"):
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, interrupt_at, "sweep", *BASE, *args, "-q", "-o", str(out)],
        capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def test_interrupt_keeps_finished_points_and_the_same_command_continues(tmp_path):
    out = tmp_path / "sweep"
    axes = ["--vary", "rate=40,20,80"]
    first = _sweep(out, *axes, interrupt_at="p001")
    assert first.returncode == 130, first.stdout + first.stderr
    said = " ".join(first.stdout.split())  # as read, whatever the terminal's width
    assert "1 of 3 runs finished" in said and "the same command continues" in said
    points = pd.read_csv(out / "results" / "points.csv")
    assert points["rate"].tolist() == [40.0]
    kept = read_manifest(out / "runs" / "p000-rate=40-r0")
    assert kept.status == "complete"
    assert read_manifest(out / "runs" / "p001-rate=20-r0").status == "interrupted"

    again = _sweep(out, *axes)
    assert again.returncode == 0, again.stdout + again.stderr
    assert read_manifest(out / "runs" / "p000-rate=40-r0").run_id == kept.run_id  # not rerun
    aside = out / "runs" / ".incomplete" / "p001-rate=20-r0-0"
    assert read_manifest(aside).status == "interrupted"  # what was recorded is kept
    assert read_manifest(out / "runs" / "p001-rate=20-r0").status == "complete"

    points = pd.read_csv(out / "results" / "points.csv")
    assert points["rate"].tolist() == [40.0, 20.0, 80.0]
    assert (points["repeats"] == 1).all()
    for column in ("ttft_p99_ms", "itl_p99_ms", "output_tok_s", "cause"):
        assert points[column].notna().all(), column
    ok = points["ttft_p99_ms_lo"] <= points["ttft_p99_ms_hi"]
    assert ok.all()
    runs = pd.read_csv(out / "results" / "runs.csv")
    assert len(runs) == 3 and set(runs["status"]) == {"complete"}
    summary = json.loads((out / "results" / "summary.json").read_text())
    assert summary["points"] == 3 and len(summary["series"]) == 1
    assert summary["series"][0]["metric"] == "ttft_p99_ms"  # a load axis, no SLO
    md = (out / "results" / "summary.md").read_text()
    assert "## What the sweep shows" in md and "| rate |" in md
    for png in ("latency.png", "throughput.png", "latency_throughput.png"):
        assert (out / "results" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for run in ("p000-rate=40-r0", "p002-rate=80-r0"):  # every point opens like any run
        assert (out / "runs" / run / "results" / "findings.json").exists()

    other = _sweep(out, "--vary", "rate=1,2")
    assert other.returncode == 1 and "holds another sweep" in other.stderr
    assert other.stderr.count("\n") == 1  # one line, no traceback


def test_a_bad_point_fails_before_anything_runs(tmp_path):
    out = tmp_path / "sweep"
    r = _sweep(out, "--vary", "block-size=16,0")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "point block-size=0" in r.stderr and r.stderr.count("\n") == 1
    assert not (out / "runs").exists()
