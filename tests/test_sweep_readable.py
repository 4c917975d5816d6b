"""What a sweep's reader sees (issue 37): throughput intervals that stay positive, a
limiting cause in words (never a measurement check's id such as `littles-law`), and a
resume that says how many runs it recorded and how many it reused."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from perfdiag.sweeps.causes import limiting_cause, readable
from perfdiag.sweeps.table import per_run_intervals


def test_a_throughput_interval_never_goes_below_zero():
    # two repeats that disagree 2x: a Student-t interval on the values was [-167, 267]
    rows = [{"output_tok_s": 33.4, "req_s": 1.0}, {"output_tok_s": 66.8, "req_s": 3.0}]
    out = per_run_intervals(rows)
    for column in ("output_tok_s", "req_s"):
        assert out[f"{column}_lo"] > 0, out
        assert out[f"{column}_lo"] <= out[column] <= out[f"{column}_hi"], out
    assert out["output_tok_s"] == np.mean([33.4, 66.8])


def test_an_interval_over_repeats_that_include_zero_stays_at_or_above_zero():
    rows = [{"goodput_req_s": 0.0}, {"goodput_req_s": 4.0}, {"goodput_req_s": 0.5}]
    out = per_run_intervals(rows)
    assert 0 <= out["goodput_req_s_lo"] <= out["goodput_req_s"] <= out["goodput_req_s_hi"]


def test_repeats_that_agree_give_a_narrow_interval():
    rows = [{"output_tok_s": v} for v in (100.0, 101.0, 99.0, 100.5)]
    out = per_run_intervals(rows)
    assert 98 < out["output_tok_s_lo"] < 100 < out["output_tok_s_hi"] < 102


def _finding(check: str, title: str, step: int = 2, severity: str = "warning"):
    return SimpleNamespace(check=check, title=title, step=step, severity=severity)


def test_a_measurement_check_is_not_a_points_limiting_cause():
    little = _finding("littles-law", "Little's law is off by 35%: λ·W 2.10 against L 1.55")
    queue = _finding("queue-dominates-ttft", "Queue wait is 80% of TTFT: 120 ms of 150 ms")
    triage = SimpleNamespace(causes=(little, queue))
    assert limiting_cause(triage) is queue
    assert limiting_cause(SimpleNamespace(causes=(little,))) is None


def test_a_cause_reads_as_words():
    assert readable("queue-dominates-ttft", "Queue wait is 80% of TTFT: 120 ms of 150 ms") == (
        "Queue wait is 80% of TTFT"
    )
    assert readable("none", "no warning or critical finding") == "none (no warning)"
    assert readable("", "") == "none (no warning)"
    assert readable("chunk-too-small", "") == "chunk-too-small"  # no title recorded: the id


def test_a_resume_says_how_many_runs_it_recorded_and_how_many_it_reused(cli, tmp_path):
    out = tmp_path / "sweep"
    args = ["sweep", "--set", "preset=tiny", "--set", "requests=6", "--set", "warmup=0",
            "--set", "prompt-len=16", "--set", "output-len=4", "--set",
            "no-device-sampling=on", "--vary", "rate=40,80", "-q", "-o", out]  # fmt: skip
    first = cli(*args, timeout=300)
    assert first.returncode == 0, first.stderr
    said = " ".join(first.stdout.split())
    assert "2 runs recorded in" in said and "reused" not in said, said
    again = cli(*args, timeout=300)
    assert again.returncode == 0, again.stderr
    said = " ".join(again.stdout.split())
    assert "no run recorded: 2 complete runs reused" in said, said
