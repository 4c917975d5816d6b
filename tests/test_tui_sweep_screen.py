"""The TUI's sweep screen as it opens (issue 37): the curves label each point with the
value the points table shows (in ms, not 1000x), and at 80x24 the screen opens at its
summary, not scrolled down to the table."""

from __future__ import annotations

import pytest
from textual.containers import VerticalScroll
from textual.widgets import DataTable

from perfdiag.sweeps.runner import run_sweep
from perfdiag.sweeps.spec import from_command_line
from perfdiag.tui import fmt
from perfdiag.tui.screens.sweep import SweepScreen
from perfdiag.tui.sweep_app import make_sweep_app


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "s"
    sets = ["preset=tiny", "requests=8", "warmup=0", "prompt-len=16", "output-len=4",
            "no-device-sampling=on"]  # fmt: skip
    run_sweep(from_command_line(sets, ["rate=30,60,120"], 1, None, None, None), out)
    return out


@pytest.mark.asyncio
async def test_the_curves_label_points_with_the_tables_values(sweep_dir):
    app = make_sweep_app(sweep_dir)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, SweepScreen)
        points = screen.sweep.points
        for column in ("ttft_p99_ms", "itl_p99_ms"):
            text = screen.curve(column, dict((c, u) for c, _, u in _curves())[column], 100).plain
            for v in points[column]:
                assert f"{fmt.num(v)} ms" in text, (column, v, text)
            table = screen.query_one("#points", DataTable)
            shown = {str(c) for i in range(table.row_count) for c in table.get_row_at(i)}
            assert {fmt.num(v) for v in points[column]} <= shown


def _curves():
    from perfdiag.tui.screens.sweep import CURVES

    return CURVES


@pytest.mark.asyncio
async def test_the_sweep_screen_opens_at_its_summary_at_80x24(sweep_dir):
    app = make_sweep_app(sweep_dir)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.pause()
        screen = app.screen
        scroll = screen.query_one(VerticalScroll)
        assert scroll.scroll_y == 0
        assert isinstance(app.focused, DataTable)  # enter still opens the selected point
        await pilot.press("down")
        await pilot.pause()
        assert screen.query_one("#points", DataTable).cursor_row == 1
