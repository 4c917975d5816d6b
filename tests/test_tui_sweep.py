"""`perfdiag tui SWEEP`: the sweep's summary, curves and points; enter opens a point's
run in the explorer with its triage, escape comes back to the sweep."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Static

from perfdiag.sweeps.runner import run_sweep
from perfdiag.sweeps.spec import from_command_line
from perfdiag.tui.screens.overview import OverviewScreen
from perfdiag.tui.screens.sweep import SweepScreen
from perfdiag.tui.sweep_app import make_sweep_app


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "s"
    sets = ["preset=tiny", "requests=8", "warmup=0", "prompt-len=16", "output-len=4",
            "no-device-sampling=on"]  # fmt: skip
    spec = from_command_line(sets, ["rate=30,60,120"], 1, None, None, None)
    run_sweep(spec, out)
    return out


@pytest.mark.asyncio
async def test_the_sweep_screen_opens_a_points_run_and_comes_back(sweep_dir):
    app = make_sweep_app(sweep_dir)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SweepScreen)
        table = screen.query_one("#points", DataTable)
        assert table.row_count == 3
        assert [table.get_row_at(i)[0] for i in range(3)] == ["30", "60", "120"]
        text = " ".join(str(s.render()) for s in screen.query(Static))
        assert "TTFT p99" in text and "across rate" in text
        table.move_cursor(row=1)
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert isinstance(app.screen, OverviewScreen)
        assert app.data.run.path.name == "p001-rate=60-r0"
        assert app.data.ready
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, SweepScreen)
        await pilot.press("r")  # a run's key on the sweep screen does nothing
        await pilot.pause()
        assert isinstance(app.screen, SweepScreen)


def test_tui_on_a_sweep_directory_is_the_sweep_app(sweep_dir, cli, tmp_path):
    (tmp_path / "sweep.json").write_text("{not json")
    r = cli("tui", tmp_path)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
