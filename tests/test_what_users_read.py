"""Small things users read (issue 21): a run's directory named by its run id, compare
showing a fixed length as a length, analyze saying when it replaces an analysis made
with other options, and the resources screen's footer keeping `q Quit` at 80 columns."""

from __future__ import annotations

import json

import pytest
import tui_runs
from test_tui_app import settle

from perfdiag.analyzers.compare_config import _workload_vars
from perfdiag.traces.reader import load_run
from perfdiag.traces.writer import RUN_ID, RunWriter, new_run_id
from perfdiag.tui.app import make_app


def test_a_directory_named_by_a_run_id_is_its_run_id(tmp_path):
    name = new_run_id("chat")
    assert RUN_ID.fullmatch(name) and name.endswith("-chat")
    for directory, same in ((tmp_path / name, True), (tmp_path / "my-run", False)):
        writer = RunWriter(directory, command=["test"])
        writer.close("complete")
        run_id = load_run(directory).manifest.run_id
        assert (run_id == directory.name) is same and RUN_ID.fullmatch(run_id)


def test_compare_shows_lengths_as_run_writes_them():
    fixed = {"kind": "fixed", "value": 1024, "low": 1, "high": 128, "median": 128.0, "sigma": 0.5}
    w = _workload_vars({"prompt_len": fixed, "output_len": {**fixed, "kind": "uniform",
                                                            "low": 16, "high": 64}})  # fmt: skip
    assert w["prompt_len"] == "1024" and w["output_len"] == "uniform:16:64"


def test_analyze_says_what_it_replaces(tmp_path, cli):
    run = tmp_path / "run"
    r = cli("run", "--preset", "tiny", "-n", "6", "--warmup", "0", "--prompt-len", "16",
            "--output-len", "4", "--no-device-sampling", "-q", "-o", run)  # fmt: skip
    assert r.returncode == 0, r.stderr
    first = cli("analyze", run)
    assert first.returncode == 0 and "note:" not in first.stdout
    recorded = json.loads((run / "results" / "findings.json").read_text())["analysis"]
    assert recorded == {"window": "steady state"}
    again = " ".join(cli("analyze", run, "--full-run", "--no-report").stdout.split())
    assert "held an analysis over steady state; now over whole run" in again
    assert "report.md is from an earlier analysis" in again
    same = cli("analyze", run, "--full-run", "--no-report").stdout
    assert "held an analysis" not in same  # the same options: nothing replaced


@pytest.mark.asyncio
async def test_resources_footer_keeps_quit_at_80_columns(tmp_path):
    app = make_app([load_run(tui_runs.demo(tmp_path / "demo"))])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        await pilot.press("4")
        await settle(app, pilot)
        shot = app.export_screenshot().replace("&#160;", " ")
        assert "Zoom in" in shot and "Quit" in shot
