"""A finding's "worst by id" lists name each request or step once (issue 37 item 1:
itl-prefill-interference listed a request once per gap, and the TUI's finding screen,
which keyed its rows by id, exited 70 with DuplicateKey), and the finding screen opens
whatever it is given, duplicates included."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import tui_runs
from textual.widgets import DataTable

from perfdiag import load_run
from perfdiag.analyzers.findings import IdList
from perfdiag.playbooks.facts import worst
from perfdiag.tui.app import make_app
from perfdiag.tui.screens.finding import FindingScreen
from perfdiag.tui.screens.request import RequestScreen


def test_worst_names_each_id_once_by_its_largest_value():
    # per-gap rows, as the ITL tail facts pass them: one request has several gaps
    gaps = pd.DataFrame(
        {
            "request_id": ["req-21", "req-23", "req-21", "req-07", "req-21", "req-23", "req-09",
                           "req-11", "req-12"],
            "interference_s": [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.0],
        }
    )  # fmt: skip
    got = worst(gaps, "interference_s", "largest interference in a gap")
    assert got.ids == ("req-21", "req-23", "req-07", "req-09", "req-11")
    assert worst(gaps, "interference_s", "x", n=2).ids == ("req-21", "req-23")


def test_worst_keeps_missing_values_out():
    gaps = pd.DataFrame({"request_id": ["a", "a", "b"], "v": [None, 2.0, float("nan")]})
    assert worst(gaps, "v", "x").ids == ("a",)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return tui_runs.demo(tmp_path_factory.mktemp("ids") / "demo")


async def _settle(app, pilot) -> None:
    for _ in range(3):
        await app.workers.wait_for_complete()
        await pilot.pause()


@pytest.mark.asyncio
async def test_finding_screen_opens_with_repeated_ids(demo):
    app = make_app(load_run(demo), ceilings_dir=demo / "none")
    async with app.run_test(size=(100, 30)) as pilot:
        await _settle(app, pilot)
        data = app.screen.data
        base = data.triage.findings[0]
        # the same request twice in one list and again in a second list of the same kind
        repeated = dataclasses.replace(
            base,
            ids=(
                IdList("request", "largest interference in a gap", ("req-11", "req-03", "req-11")),
                IdList("request", "longest TTFT", ("req-03",)),
            ),
        )
        app.push_screen(FindingScreen(data, repeated))
        await _settle(app, pilot)
        assert isinstance(app.screen, FindingScreen)
        ids = app.screen.query_one("#ids", DataTable)
        assert ids.row_count == 4
        assert [ids.get_row_at(i)[1] for i in range(4)] == ["req-11", "req-03", "req-11", "req-03"]
        ids.focus()
        ids.move_cursor(row=2)
        await pilot.press("enter")
        await _settle(app, pilot)
        assert isinstance(app.screen, RequestScreen) and app.screen.request_id == "req-11"
