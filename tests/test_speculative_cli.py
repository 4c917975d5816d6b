"""Speculative decoding in what users read: `perfdiag analyze --details` prints the
acceptance table only for a run with the spec_* counters, metrics.json carries the
figures (null without them), and `perfdiag compare` adds acceptance and tokens per
forward beside the throughput delta; the draft phase exports (Perfetto, Chrome JSON)
and shows in the TUI's step detail like any other phase."""

from __future__ import annotations

import json

import pytest
from spec_runs import plain_run, spec_run, write_run
from typer.testing import CliRunner

from perfdiag.cli import app


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")


def cli(*args):
    result = CliRunner().invoke(app, [*map(str, args)], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec")
    return {
        "spec": write_run(root / "spec", spec_run(alpha=0.7, steps=60)),
        "plain": write_run(root / "plain", plain_run(steps=60)),
    }


def test_analyze_prints_the_acceptance_only_for_a_speculative_run(runs):
    text = cli("analyze", runs["spec"], "--details", "--no-report")
    assert "speculative decoding (ngram, K = 4)" in text
    assert "acceptance rate (accepted / drafted)" in text and "tokens per target forward" in text
    plain = cli("analyze", runs["plain"], "--details", "--no-report")
    # (the checks' list names the speculative checks as not evaluated, as every
    # check a run cannot feed; no figure is shown)
    assert "speculative decoding (ngram" not in plain and "acceptance rate" not in plain
    short = cli("analyze", runs["plain"], "--no-report")
    assert "tokens per target forward" not in short and "accepted" not in short


def test_metrics_json_carries_the_figures(runs):
    data = json.loads(cli("analyze", runs["spec"], "--json", "--no-report"))
    s = data["speculative"]
    assert s["k"] == 4 and 0 < s["acceptance"] < s["alpha"] < 1
    assert s["tokens_per_forward"] == pytest.approx(1 + s["mean_accepted"])
    assert json.loads(cli("analyze", runs["plain"], "--json", "--no-report"))["speculative"] is None


def test_compare_reports_acceptance_beside_the_throughput(runs):
    text = cli("compare", runs["plain"], runs["spec"])
    assert "draft acceptance" in text and "tokens per target forward" in text
    data = json.loads(cli("compare", runs["plain"], runs["spec"], "--json"))
    rows = {d["metric"]: d for d in data["deltas"]}
    assert rows["spec.tokens_per_forward"]["a"] is None and rows["spec.tokens_per_forward"]["b"] > 1
    assert "spec.acceptance" not in {
        d["metric"]
        for d in json.loads(cli("compare", runs["plain"], runs["plain"], "--json"))["deltas"]
    }


def test_the_draft_phase_exports_and_shows_in_the_step_detail(runs):
    from perfdiag import load_run
    from perfdiag.traces.exporters import export_run
    from perfdiag.tui.data import RunData
    from perfdiag.tui.data_steps import SpanIndex, step_detail, steps_frame

    out = export_run(runs["spec"], "chrome", runs["spec"] / "t.json")
    events = json.loads(out.path.read_text())["traceEvents"]
    names = {e.get("name") for e in events if e.get("ph") == "X"}
    assert {"draft", "forward", "sample"} <= names
    assert export_run(runs["spec"], "perfetto", runs["spec"] / "t.pftrace").slices
    data = RunData(load_run(runs["spec"]))
    d = step_detail(data, SpanIndex(data), 3, steps_frame(data))
    assert d.phases["name"].tolist() == ["schedule", "draft", "forward", "sample", "post_process"]
