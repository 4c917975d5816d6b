"""The explorer over imported traces: step 4 shows the critical path, and two traces
compared show the trace diff first, with its own screen (d) ranking what changed."""

from __future__ import annotations

import pytest
from kineto_traces import synced_steps_trace
from test_tui_app import settle, text_of
from textual.widgets import DataTable

from perfdiag import load_run
from perfdiag.tui.app import make_app
from perfdiag.tui.screens.compare import CompareScreen
from perfdiag.tui.screens.resources import ResourcesScreen
from perfdiag.tui.screens.trace_diff import TraceDiffScreen


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    from typer.testing import CliRunner

    from perfdiag.cli import app as cli_app

    base = tmp_path_factory.mktemp("traces")
    runs = []
    for name, kw in (("a", {}), ("b", {"gemm_us": 200, "extra_kernel": "fill_kernel"})):
        trace = synced_steps_trace(base / f"{name}.json", **kw)
        result = CliRunner().invoke(cli_app, ["import", str(trace), "-o", str(base / name)])
        assert result.exit_code == 0, result.output
        runs.append(base / name)
    return runs


@pytest.mark.asyncio
async def test_step_4_shows_the_critical_path(traces):
    app = make_app(load_run(traces[0]))
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("4")
        await settle(app, pilot)
        assert isinstance(app.screen, ResourcesScreen)
        text = text_of(app.screen.query_one("#critical-path"))
        assert "critical path (3 steps)" in text
        assert "kernel: gemm" in text and "halved" in text


@pytest.mark.asyncio
async def test_trace_diff_screen(traces):
    app = make_app([load_run(traces[0]), load_run(traces[1])])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("c")
        await settle(app, pilot)
        assert isinstance(app.screen, CompareScreen)
        summary = text_of(app.screen.query_one("#trace-summary"))
        assert summary.startswith("trace diff (per step): gemm changed (-0.100 ms)")
        assert "fill_kernel added" in summary
        await pilot.press("d")
        await settle(app, pilot)
        assert isinstance(app.screen, TraceDiffScreen)
        table = app.screen.query_one("#trace-ops DataTable", DataTable)
        first = [str(c) for c in table.get_row_at(0)]
        assert first[:3] == ["gpu", "changed", "gemm"] and first[3] == "-0.100"
        names = [str(table.get_row_at(i)[2]) for i in range(table.row_count)]
        assert "fill_kernel" in names
        assert "cudaLaunchKernel" in text_of(app.screen.query_one("#trace-launches"))
        await pilot.press("escape")
        assert isinstance(app.screen, CompareScreen)


@pytest.mark.asyncio
async def test_trace_screens_at_80x24(traces):
    app = make_app([load_run(traces[0]), load_run(traces[1])])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        for keys, screen in ((("4",), ResourcesScreen), (("c", "d"), TraceDiffScreen)):
            for key in keys:
                await pilot.press(key)
                await settle(app, pilot)
            assert isinstance(app.screen, screen)
            assert app.screen.query("DataTable")  # built at the smallest size, no error
            await pilot.press(*["escape"] * len(keys))
            await settle(app, pilot)
