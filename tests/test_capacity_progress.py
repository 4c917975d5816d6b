"""`perfdiag capacity` while it runs (issue 37): a rate level lasts the --duration asked
even at low rates (and says when that leaves few requests), the progress line estimates
the time left from the runs so far and the bracket, and Ctrl-C keeps every finished
level in capacity.json and says where."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

from perfdiag.analyzers.slo import parse_slo
from perfdiag.sweeps.capacity import MEETS, MISSES, Level, SearchSettings
from perfdiag.sweeps.capacity_progress import CapacityProgress
from perfdiag.sweeps.capacity_runs import MIN_REQUESTS, CapacityPlan


def test_a_rate_level_lasts_the_asked_duration_at_low_rates():
    plan = CapacityPlan({"preset": "tiny"}, parse_slo("ttft=0.5"), duration_s=20)
    assert plan.flags(0.5, 0)["requests"] == 10  # was 24 requests: 48 s of arrivals
    assert plan.flags(4.0, 0)["requests"] == 80
    assert plan.flags(0.01, 0)["requests"] == 2  # one warm-up, one measured
    assert plan.few_requests(0.5) and not plan.few_requests(4.0)
    assert plan.flags(4.0, 0)["requests"] >= MIN_REQUESTS


def _level(x: float, decision: str, repeats: int = 2) -> Level:
    level = Level(x, decision=decision)
    level.samples = [None] * repeats  # only their count matters here
    return level


def test_the_time_left_comes_from_the_runs_so_far_and_the_bracket():
    p = CapacityProgress(SearchSettings(tolerance=0.1, min_repeats=2))
    assert p.eta_s() is None and "estimating" in p.line()
    p.run_done(10.0)
    p.run_done(14.0)
    p.level_done(_level(40, MEETS))
    assert p.levels_left() is None and "bracketing" in p.line()  # no level missed yet
    p.run_done(12.0)
    p.run_done(12.0)
    p.level_done(_level(80, MISSES))
    # 80/40 = 2 down to 1.1 by geometric halving: log(2)/log(1.1) = 7.3 -> 3 more levels
    assert p.levels_left() == 3
    assert p.eta_s() == 3 * 2 * 12.0
    assert "4 runs in 48 s" in p.line() and "~72 s left" in p.line()
    p.level_done(_level(56.57, MEETS))
    assert p.levels_left() == 2  # 80/56.57 = 1.41


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
        if "rate=40-" not in self._test_path and e.step_id >= 3 and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)
    recorder.RunRecorder.__init__, recorder.RunRecorder.on_step = _init, _on_step
    from perfdiag.cli import main
    main(sys.argv[1:])
    """
)


def test_ctrl_c_keeps_the_finished_levels_and_says_where(tmp_path):
    out = tmp_path / "cap"
    args = ["capacity", "--slo", "ttft=0.5", "--set", "preset=tiny", "--set", "prompt-len=16",
            "--set", "output-len=4", "--set", "no-device-sampling=on", "--start", "40",
            "--duration", "1", "--max-repeats", "2", "-q", "-o", str(out)]  # fmt: skip
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert r.returncode == 130, r.stdout + r.stderr
    said = " ".join(r.stdout.split())
    assert f"{out}/capacity.json" in said and "1 level finished" in said, said
    data = json.loads((out / "capacity.json").read_text())
    assert data["verdict"] == "interrupted"
    [level] = data["levels"]
    assert level["x"] == 40 and len(level["repeats"]) == 2 and level["decision"] != "unsure"


def test_a_qualifier_other_than_host_load_is_not_called_other_load(capsys):
    from pathlib import Path

    from perfdiag.cli.app import out
    from perfdiag.cli.capacity import print_capacity
    from perfdiag.sweeps.capacity import Sample, search

    def measure(x, repeat):  # short runs at every level: few requests, no host load
        return Sample(20, 20 if x < 7 else 10, "runs/r", "none", "", "", "few-requests")

    with out.capture() as captured:
        print_capacity(search(measure, 10.0), None, "rate", "req/s", Path("cap"))
    said = " ".join(captured.get().split())
    assert "few-requests" in said and "other load on this machine" not in said, said
