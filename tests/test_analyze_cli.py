"""`perfdiag analyze RUN`: readable tables, results/metrics.json, --json, SLOs, and runs
that lack what an analysis needs (that analysis says so, the others still run)."""

import json

import pytest
import serving_runs as runs
from typer.testing import CliRunner

from perfdiag.cli import app
from perfdiag.traces.layout import parquet_path
from perfdiag.traces.schema import Span


def analyze(*args):
    result = CliRunner().invoke(app, ["analyze", *map(str, args)], terminal_width=160)
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture
def basic(tmp_path):
    return runs.basic(tmp_path / "basic")


def test_tables_and_metrics_json(basic):
    text = analyze(basic, "--full-run", "--details", "--slo", "ttft=10ms")
    for title in ("latency", "TTFT critical path", "ITL attribution", "load (triage step 2)",
                  "steps and their cost", "prefix cache"):  # fmt: skip
        assert title in text
    assert "25.0% of 4" in text  # SLO attainment: only B of A, B, R, E
    saved = json.loads((basic / "results" / "metrics.json").read_text())
    assert saved["metrics"]["goodput"]["attainment"] == pytest.approx(0.25)
    assert saved["ttft"]["p99"]["queue_s"] == pytest.approx(0.030)
    assert saved["metrics"]["ttft_s"]["count"] == 3
    # the step-cost model needs at least 8 steps; this run has 4
    assert saved["step_cost"] == {"missing": ["8+ steps"]}


def test_json_output_matches_the_file(basic):
    printed = json.loads(analyze(basic, "--json", "--full-run"))
    assert printed == json.loads((basic / "results" / "metrics.json").read_text())
    assert printed["metrics"]["itl_per_token_s"]["count"] == 6
    assert printed["metrics"]["goodput"] is None
    assert "per_request" not in printed["metrics"]  # per-row tables stay out


def test_slo_from_a_yaml_file(basic, tmp_path):
    slo = tmp_path / "slo.yaml"
    slo.write_text("ttft: 10ms\ntpot: 0.05\n")
    data = json.loads(analyze(basic, "--json", "--full-run", "--slo-file", slo))
    assert data["metrics"]["goodput"]["slo"]["ttft_s"] == pytest.approx(0.01)
    assert data["metrics"]["goodput"]["good"] == 1


def test_a_run_without_requests_still_gets_what_it_can(tmp_path):
    # like an imported profiler trace: spans only
    spans = [Span("gemm", "kernel", runs.ns(i), 1000, device=0, stream=7) for i in range(5)]
    path = runs.write(tmp_path / "kineto", [], [], spans=spans)
    for name in ("requests", "request_events", "steps"):
        parquet_path(path, name).unlink()
    text = analyze(path)
    # a bare trace: the serving steps do not apply (said once), nor is data said missing
    assert "not applicable to a profiler trace without requests" in text
    assert "the run lacks requests" not in text
    data = json.loads(analyze(path, "--json"))
    assert data["metrics"] == {"missing": ["requests", "request_events"]}
    assert data["composition"] == {"missing": ["steps"]}


def test_a_run_without_steps_keeps_metrics_and_decomposes_what_it_can(basic):
    parquet_path(basic, "steps").unlink()
    data = json.loads(analyze(basic, "--json", "--full-run"))
    assert data["composition"] == {"missing": ["steps"]}
    assert data["metrics"]["outcomes"]["ok"] == 2
    assert data["ttft"]["step_timeline"] is False
    assert data["ttft"]["p99"]["remainder_s"] == pytest.approx(0.0073)  # A's prefill


def test_a_run_without_client_events_has_no_load_checks(tmp_path):
    engine_only = [runs.engine("A", "arrival", 0), runs.engine("A", "tokenize_end", 1),
                   runs.engine("A", "scheduled", 2, step=0, tokens=4, cached=0),
                   runs.engine("A", "prefill_chunk", 3, step=0, tokens=4),
                   runs.engine("A", "first_token", 3, step=0, tokens=1),
                   runs.engine("A", "finished", 3, step=0, tokens=1, detail="stop")]  # fmt: skip
    path = runs.write(tmp_path / "engine", [], engine_only, [runs.step(0, 2, 3.5, pf_tokens=4)])
    data = json.loads(analyze(path, "--json", "--full-run"))
    assert data["basis"] == "engine"
    assert data["load"] == {"missing": ["request_events.client"]}
    assert data["metrics"]["ttft_s"]["p50"] == pytest.approx(0.003)


def test_bad_input_is_one_line(cli, basic, tmp_path):
    for args, fragment in (
        (("--slo", "ttft=fast"), "not a time"),
        (("--slo", "latency=1"), "unknown SLO target"),
        (("--slo", "ttft=1", "--slo-file", tmp_path / "x.yaml"), "not both"),
    ):
        result = cli("analyze", basic, *args)
        assert result.returncode == 1 and "Traceback" not in result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and fragment in lines[0], result.stderr
    result = cli("analyze", tmp_path / "nope")
    assert result.returncode == 1 and "Traceback" not in result.stderr
