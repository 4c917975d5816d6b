"""The single-file HTML report (perfdiag report, analyze --html) from a real tiny run:
self-contained (no URL to fetch), every finding's title and every step's status and
counts as the triage view gives them (so as the CLI prints them), a plot for each
analysis the run has, probe stalls and the profiler window marked; bad input is one
line and exit 1. The browser check itself is `make html-check` (scripts/check_html_report.py)."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys

import pytest
from test_triage_agreement import RUN as CAPPED
from test_triage_agreement import cli_steps, expected
from typer.testing import CliRunner

from perfdiag.cli import app as cli_app
from perfdiag.cli.analyze import triage_of
from perfdiag.playbooks.triage_view import triage_view

# The agreement test's capped run (warnings fire) with a profiler window (probe stalls).
RUN = (*CAPPED, "--profile-steps", "10:20")
FETCHING = re.compile(r"""<(script|link|img|iframe|source|embed)\b[^>]*\b(src|href)\s*=""", re.I)
SCRIPT = re.compile(r"<script>.*?</script>", re.S)
EXTERNAL = re.compile(r"""\b(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.I)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("html") / "run"
    cmd = [sys.executable, "-m", "perfdiag", *RUN, "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    cli = CliRunner().invoke(
        cli_app, ["analyze", str(out), "--html"], terminal_width=200, env={"COLUMNS": "200"}
    )
    assert cli.exit_code == 0, cli.output
    page = (out / "results" / "report.html").read_text(encoding="utf-8")
    data = json.loads((out / "results" / "findings.json").read_text())
    return out, page, cli.stdout, data


def test_report_command_writes_one_self_contained_file(recorded, tmp_path):
    out, _, _, _ = recorded
    target = tmp_path / "r.html"
    result = CliRunner().invoke(cli_app, ["report", str(out), "--out", str(target)])
    assert result.exit_code == 0, result.output
    assert "written:" in result.output and "self-contained" in result.output
    page = target.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # Nothing to fetch: no element that loads a resource, no src/href to another host in
    # the markup (plotly.js, inlined, names URLs in strings: the browser check, make
    # html-check, asserts the page requests none of them).
    assert not FETCHING.search(page), FETCHING.search(page)
    markup = SCRIPT.sub("", page)
    assert not EXTERNAL.search(markup), EXTERNAL.search(markup)
    assert page.count("<script>") >= 2  # plotly.js inlined once, then each figure
    assert target.stat().st_size < 8 * 2**20


def test_findings_and_steps_are_the_triage_views(recorded):
    out, page, _, _ = recorded
    _ctx, triage, _ = triage_of(out)
    view = triage_view(triage)
    assert triage.findings, "the capped run should fire findings"
    for f in triage.findings:
        assert f'id="finding-{f.check}"' in page
        assert html.escape(f.title) in page, f.title
        for e in f.evidence if f.severity != "info" else ():
            assert html.escape(e.text()) in page, (f.check, e.label)
    assert html.escape(view.verdict) in page
    rows = dict(re.findall(r'<tr id="step-(\d)">(.*?)</tr>', page))
    assert sorted(map(int, rows)) == [s.step for s in view.steps]
    for st in view.steps:
        row = rows[str(st.step)]
        assert f">{st.status_text}</span>" in row, (st.step, row)
        assert html.escape(st.counts.text()) in row, (st.step, row)
        for o in st.outcomes:
            assert html.escape(o.text()) in page, o.check


def test_html_agrees_with_the_cli_and_the_rule(recorded):
    _, page, stdout, data = recorded
    rule = expected(data)
    cli = cli_steps(stdout)
    rows = re.findall(r'<tr id="step-(\d)">.*?<span class="[^"]*">([a-z ]+)</span>', page)
    html_status = {int(n): s for n, s in rows}
    assert html_status == {n: s for n, (s, _) in rule.items()}
    assert html_status == {n: s for n, (s, _) in cli.items()}


def test_a_plot_for_each_analysis_with_stalls_marked(recorded):
    _, page, _, _ = recorded
    for name in ("latency", "ttft_parts", "itl_causes", "steps", "load", "roofline"):
        assert f'id="fig-{name}"' in page, name
    assert "probe stall" in page and "profiler window (steps 10" in page
    assert "engine queue (arrived, not yet running)" in page
    # A finding that names a figure links to it.
    assert re.search(r'<a href="#fig-[a-z_]+">', page)


def test_bad_input_is_one_line(cli, tmp_path):
    for args in (("report", tmp_path / "nope"), ("report", tmp_path)):
        result = cli(*args)
        assert result.returncode == 1, (result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("perfdiag: error: "), result.stderr
        assert "Traceback" not in result.stderr


def test_html_with_no_report_is_refused(cli, tmp_path):
    result = cli("analyze", tmp_path, "--html", "--no-report")
    assert result.returncode == 1 and "--no-report" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
