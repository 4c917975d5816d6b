"""The CLI (`perfdiag analyze`), the TUI and report.md show one triage: rendered from one
real recorded run, they agree on every step's status and counts and on the verdict, and
those follow the status rule of playbooks/triage_view.py recomputed here from the raw
check outcomes in results/findings.json."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from perfdiag import load_run
from perfdiag.cli import app as cli_app
from perfdiag.tui.app import make_app

# A capped open loop (the cap holds requests back) of few requests: warnings fire.
RUN = ("run", "--preset", "tiny", "--prompt-len", "uniform:8:64", "--output-len", "uniform:4:12",
       "--no-device-sampling", "-q", "-n", "16", "--rate", "100", "-c", "2")  # fmt: skip
COUNTS = re.compile(
    r"(\d+) passed(?:, (\d+) fired \(([^)]*)\))?(?:, (\d+) not evaluated)?$"
)  # the long counts text
SHORT = re.compile(r"(\d+) ok(?: · (\d+) fired)?(?: · (\d+) n/e)?$")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("agree") / "run"
    cmd = [sys.executable, "-m", "perfdiag", *RUN, "--out", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    cli = CliRunner().invoke(
        cli_app, ["analyze", str(out)], terminal_width=200, env={"COLUMNS": "200"}
    )
    assert cli.exit_code == 0, cli.output
    data = json.loads((out / "results" / "findings.json").read_text())
    report = (out / "results" / "report.md").read_text()
    return out, cli.stdout, report, data


def expected(data) -> dict[int, tuple[str, tuple[int, int, int]]]:
    """The rule, from the raw outcomes: fired (a warning or critical check) > not
    evaluated (none could run) > partial (some could not) > pass; counts are
    (passed, fired at any severity, not evaluated)."""
    out = {}
    for s in data["steps"]:
        checks = s["checks"]
        fired = [c for c in checks if c["status"] == "fired"]
        missing = [c for c in checks if c["status"] == "not-evaluated"]
        if any(c["severity"] in ("warning", "critical") for c in fired):
            status = "fired"
        elif len(missing) == len(checks):
            status = "not evaluated"
        else:
            status = "partial" if missing else "pass"
        passed = sum(c["status"] == "passed" for c in checks)
        out[s["step"]] = (status, (passed, len(fired), len(missing)))
    return out


def long_counts(text: str) -> tuple[int, int, int]:
    m = COUNTS.search(text.strip())
    assert m, text
    return int(m[1]), int(m[2] or 0), int(m[4] or 0)


def short_counts(text: str) -> tuple[int, int, int]:
    m = SHORT.search(text.strip())
    assert m, text
    return int(m[1]), int(m[2] or 0), int(m[3] or 0)


def cli_steps(text: str) -> dict[int, tuple[str, tuple[int, int, int]]]:
    part = text.split("Triage steps")[1]
    rows = re.findall(r"^ (\d) .+? — ([a-z ]+): (.+)$", part, re.M)
    return {int(n): (status, long_counts(counts)) for n, status, counts in rows}


def report_steps(text: str) -> dict[int, tuple[str, tuple[int, int, int]]]:
    part = text.split("## Triage steps")[1].split("\n## ")[0]
    rows = re.findall(r"^\| (\d) \| .+? \| ([a-z ]+) \| ([^|]+) \|", part, re.M)
    return {int(n): (status, long_counts(counts)) for n, status, counts in rows}


def plain(content) -> str:
    from rich.console import Console

    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(content)
    return console.export_text()


async def tui_render(path):
    """The overview's steps table and headline, and each step screen's header."""
    from textual.widgets import DataTable

    app = make_app(load_run(path))
    steps, heads = {}, {}
    async with app.run_test(size=(120, 40)) as pilot:

        async def settle():
            for _ in range(3):
                await app.workers.wait_for_complete()
                await pilot.pause()

        await settle()
        headline = plain(app.screen.query_one("#headline").content)
        table = app.screen.query_one("#steps", DataTable)
        for n in range(8):
            row = table.get_row(f"step{n}")
            status = str(row[1]).split(" ", 1)[1]  # "✖ fired" → "fired"
            steps[n] = (status, short_counts(str(row[3])))
        for n in range(8):
            await pilot.press(str(n))
            await settle()
            heads[n] = plain(app.screen.query_one("#step-head").content)
            await pilot.press("escape")
            await settle()
    return headline, steps, heads


@pytest.mark.asyncio
async def test_cli_tui_and_report_agree_on_every_step_and_the_verdict(recorded):
    path, cli_text, report, data = recorded
    want = expected(data)
    assert sorted(want) == list(range(8))
    assert any(f["severity"] in ("warning", "critical") for f in data["findings"])
    assert cli_steps(cli_text) == want
    assert report_steps(report) == want
    headline, tui_steps, heads = await tui_render(path)
    assert tui_steps == want
    for n, (status, counts) in want.items():
        head = heads[n]
        assert f"Step {n}:" in head and status in head.splitlines()[0]
        assert long_counts(head.splitlines()[1]) == counts

    # the verdict: the same top cause everywhere, and never "no problem" beside one
    top = next((f for f in data["findings"] if f["check"] == data["top"]), None)
    for text in (cli_text, report, headline):
        assert "No problem found" not in text and "no problem]" not in text
        if top is not None:
            assert top["title"] in " ".join(text.split())
    qualifiers = [f for f in data["findings"] if f["step"] <= 1]
    if any(f["severity"] != "info" for f in qualifiers):
        for text in (cli_text, report, headline):
            assert re.search(r"\d+ problems? that qualif(y|ies) every finding after them", text)
    # the gate is steps 0 and 1, and said so
    assert "(steps 0 and 1)" in cli_text and "(steps 0 and 1)" in report
    assert "gate, step 1" not in cli_text + report


def test_outcomes_read_with_their_unit_and_threshold(recorded):
    report = recorded[2]
    checks = report.split("## Checks")[1]
    # a passed share reads as a percentage against the check's threshold, never bare
    line = next(x for x in checks.splitlines() if "`client-behind-schedule`" in x)
    assert re.search(
        r"passed: issued rate below the client's plan [<\d.,]+% \(fires at ≥ 10%\)", line
    )
    line = next(x for x in checks.splitlines() if "`over-capacity`" in x)
    assert "TTFT growth per second of load" in line and "s/s (fires at ≥ 0.1 s/s)" in line
    # no outcome is a bare number or a bare dash
    for x in checks.splitlines():
        if "passed:" in x:
            assert " – " not in x and not re.search(r"passed \([\d.e-]+\)", x)


def test_every_fact_says_what_its_value_measures():
    from perfdiag.playbooks.check_values import FACT_MEASURES, measure
    from perfdiag.playbooks.facts import load_registry
    from perfdiag.playbooks.schema import load_playbook

    assert set(load_registry()) <= set(FACT_MEASURES)
    for step in load_playbook().steps:
        for check in step.checks:
            label, _ = measure(check.fact, dict(check.params))
            assert label and "{" not in label and "_" not in label, (check.id, label)
