"""The explorer driven by keys (Textual's pilot) over the hand-built demo runs: open a
run, read the findings, follow one to its evidence, drill into a request and a step,
come back; compare two runs; the tables' sorting, filtering and paging; help; errors."""

from __future__ import annotations

import pandas as pd
import pytest
import tui_runs
from textual.app import App
from textual.widgets import DataTable

from perfdiag import load_run
from perfdiag.tui.app import make_app
from perfdiag.tui.screens.checks import TriageStepScreen
from perfdiag.tui.screens.compare import CompareScreen
from perfdiag.tui.screens.finding import FindingScreen
from perfdiag.tui.screens.help import HelpScreen
from perfdiag.tui.screens.overview import OverviewScreen
from perfdiag.tui.screens.request import RequestScreen
from perfdiag.tui.screens.requests import RequestsScreen
from perfdiag.tui.screens.resources import ResourcesScreen
from perfdiag.tui.screens.roofline import RooflineScreen
from perfdiag.tui.screens.step import EngineStepScreen
from perfdiag.tui.widgets.frame_table import PAGE, Column, FrameView


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("tui")
    a = tui_runs.demo(base / "demo-a")
    b = tui_runs.demo(base / "demo-b", chunk=48, flip="req-05", run_id="demo-b")
    return a, b


async def settle(app, pilot) -> None:
    """Let the background analysis and any screen's preparation finish."""
    for _ in range(3):
        await app.workers.wait_for_complete()
        await pilot.pause()


def text_of(widget) -> str:
    """A widget's content as plain text (a Static's renderable printed at 200 columns)."""
    from rich.console import Console
    from textual.widgets import Static

    content = widget.content if isinstance(widget, Static) else widget.render()
    console = Console(width=200, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(content)
    return console.export_text()


@pytest.mark.asyncio
async def test_open_run_findings_evidence_request_and_back(runs):
    app = make_app(load_run(runs[0]), ceilings_dir=runs[0] / "none")
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        assert isinstance(app.screen, OverviewScreen)
        assert "host-bound" in text_of(app.screen.query_one("#headline"))
        findings = app.screen.query_one("#findings", DataTable)
        assert app.focused is findings and findings.row_count == 6  # with critical-path (info)
        # the fourth finding: requests queue; its evidence names the requests
        await pilot.press("down", "down", "down", "enter")
        await settle(app, pilot)
        assert isinstance(app.screen, FindingScreen)
        assert app.screen.finding.check == "queue-dominates-ttft"
        assert "mean engine queue" in text_of(app.screen.query_one("#evidence"))
        ids = app.screen.query_one("#ids", DataTable)
        assert app.focused is ids and ids.get_row_at(0)[1] == "req-11"
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, RequestScreen) and app.screen.request_id == "req-11"
        timeline = text_of(app.screen.query_one("#request-timeline"))
        assert "░" in timeline and "▓" in timeline and "█" in timeline  # queue, prefill, decode
        # the steps it ran in → the prefill step's kernels
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, EngineStepScreen) and app.screen.step_id == 8
        work = app.screen.query_one("#step-work", FrameView)
        assert "gemm_qkv" in work.frame["name"].tolist()
        for expected in (RequestScreen, FindingScreen, OverviewScreen, OverviewScreen):
            await pilot.press("escape")
            await pilot.pause()
            assert isinstance(app.screen, expected)


@pytest.mark.asyncio
async def test_finding_leads_to_its_step_screen(runs):
    app = make_app(load_run(runs[0]))
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(app, pilot)
        await pilot.press("down", "enter")  # host-bound, step 4
        await settle(app, pilot)
        assert app.screen.finding.check == "host-bound"
        # its evidence names steps: enter opens the first one
        first = app.screen.finding.ids[0].ids[0]
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, EngineStepScreen) and app.screen.step_id == int(first)
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("g")
        await settle(app, pilot)
        assert isinstance(app.screen, ResourcesScreen) and app.screen.step == 4
        checks = app.screen.query_one("#checks", DataTable)
        assert "critical" in str(checks.get_row("finding:host-bound")[1])
        lanes = text_of(app.screen.query_one("#lanes"))
        assert "engine steps" in lanes and "gpu0 s7" in lanes and "GPU idle cause" in lanes
        before = app.screen.window
        await pilot.press("plus")
        assert app.screen.window[1] - app.screen.window[0] < before[1] - before[0]
        await pilot.press("right_square_bracket")
        assert app.screen.window[0] > before[0]
        await pilot.press("w")
        assert app.screen.window == (app.screen.lanes.lo, app.screen.lanes.hi)
        # enter on the fired check opens its finding
        checks.focus()
        checks.move_cursor(row=checks.get_row_index("finding:host-bound"))
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, FindingScreen)


@pytest.mark.asyncio
async def test_requests_table_sort_filter_open(runs):
    app = make_app(load_run(runs[0]))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        await pilot.press("r")
        await settle(app, pilot)
        assert isinstance(app.screen, RequestsScreen)
        view = app.screen.query_one(FrameView)
        table = view.table
        first = table.get_row_at(0)[0]
        assert first == "req-10"  # sorted by TTFT, longest first
        await pilot.press("S")  # reverse: shortest first
        assert table.get_row_at(0)[0] == "req-00"
        await pilot.press("slash")
        await pilot.press(*"prompt>100", "enter")
        await pilot.pause()
        shown = [table.get_row_at(i)[0] for i in range(table.row_count)]
        assert sorted(shown) == ["req-01", "req-03", "req-07", "req-10"]
        assert "filtered from 12" in text_of(view.query_one(".status"))
        view.filter_to("bogus>1")
        await pilot.pause()
        assert "no column" in text_of(view.query_one(".status"))
        assert table.row_count == 4  # a bad query keeps the rows as they were
        await pilot.press("enter")
        await settle(app, pilot)
        assert isinstance(app.screen, RequestScreen) and app.screen.request_id == shown[0]


@pytest.mark.asyncio
async def test_steps_table_and_roofline(runs):
    app = make_app(load_run(runs[0]), ceilings_dir=runs[0] / "none")
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        await pilot.press("t")
        await settle(app, pilot)
        table = app.screen.query_one(FrameView).table
        assert table.row_count == 16
        await pilot.press("down", "down", "enter")
        await settle(app, pilot)
        assert isinstance(app.screen, EngineStepScreen) and app.screen.step_id == 2
        assert "of its roof" in text_of(app.screen.query_one("#step-roofline"))
        await pilot.press("y")
        await settle(app, pilot)
        assert isinstance(app.screen, RooflineScreen)
        chart = text_of(app.screen.query_one("#roofline-chart"))
        assert "─" in chart and "•" in chart and "×" in chart
        assert "H100" in text_of(app.screen.query_one("#ceilings"))


@pytest.mark.asyncio
async def test_every_screen_at_80x24(runs):
    """Each key's screen builds at the smallest supported size without an error."""
    app = make_app(load_run(runs[0]))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(app, pilot)
        for key in ("0", "1", "2", "3", "4", "5", "6", "7", "r", "t", "y"):
            await pilot.press(key)
            await settle(app, pilot)
            assert app.screen is not None and len(app.screen_stack) == 3, key
            if key in "01234567":
                assert isinstance(app.screen, TriageStepScreen) and app.screen.step == int(key)
            await pilot.press("escape")
            await pilot.pause()
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert isinstance(app.screen, OverviewScreen)
        await pilot.press("c")  # one run: nothing to compare, a notice instead
        assert isinstance(app.screen, OverviewScreen)


@pytest.mark.asyncio
async def test_compare_two_runs(runs):
    app = make_app([load_run(runs[0]), load_run(runs[1])])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        assert app.comparison is not None
        assert "B demo-b" in text_of(app.screen.query_one("#title"))  # the run under study
        # steps 6 and 7 on the overview are B's checks against A: outputs differ, fail
        steps = app.screen.query_one("#steps", DataTable)
        assert (
            "fired" in str(steps.get_row("step7")[1]) and "B against A" in steps.get_row("step7")[2]
        )
        await pilot.press("c")
        await settle(app, pilot)
        assert isinstance(app.screen, CompareScreen)
        assert "engine.chunk_size" in text_of(app.screen.query_one("#variables"))
        assert "outputs differ for 1 of 12" in text_of(app.screen.query_one("#correctness"))
        assert "TTFT p50" in text_of(app.screen.query_one("#deltas"))
        await pilot.press("enter")  # the differing request, in run B
        await settle(app, pilot)
        assert isinstance(app.screen, RequestScreen) and app.screen.request_id == "req-05"
        assert app.screen.data is app.datasets[1]
        await pilot.press("escape", "escape")
        await pilot.press("7")  # step 7 with two runs is the comparison
        await settle(app, pilot)
        assert isinstance(app.screen, CompareScreen)
        await pilot.press("escape", "b")  # explore the baseline, A
        await settle(app, pilot)
        assert isinstance(app.screen, OverviewScreen) and app.screen.data.label == "A"
        assert "A demo-a" in text_of(app.screen.query_one("#title"))


class FrameApp(App):
    def __init__(self, frame):
        super().__init__()
        self.frame = frame

    def compose(self):
        yield FrameView(self.frame, [Column("id", "id", 8), Column("x", "x", 6)], "id")


@pytest.mark.asyncio
async def test_frame_view_pages_large_tables():
    """Never more than a page of rows in the DataTable, added as the cursor nears them;
    moving past a page's edge turns the page."""
    n = 2 * PAGE + 20
    frame = pd.DataFrame({"id": [f"r{i:05d}" for i in range(n)], "x": range(n)})
    app = FrameApp(frame)
    async with app.run_test(size=(60, 20)) as pilot:
        view = app.query_one(FrameView)
        table = view.table
        table.focus()
        assert table.row_count == 100  # one chunk to start with
        for _ in range(26):  # ~19 rows each: to the end of the first page, not past it
            await pilot.press("pagedown")
        assert table.row_count == PAGE and view.page == 0
        await pilot.press("pagedown", "pagedown")  # past its last row: the next page
        assert view.page == 1 and table.get_row_at(0)[0] == f"r{PAGE:05d}"
        await pilot.press("end")
        assert view.page == 2 and table.row_count == 20
        assert table.get_row_at(table.cursor_row)[0] == f"r{n - 1:05d}"
        await pilot.press("home")
        assert view.page == 0 and table.get_row_at(0)[0] == "r00000"
        table.move_cursor(row=99)
        await pilot.pause()
        assert table.row_count > 100  # filled ahead of the cursor
        view.show_page(0)
        view.fill(PAGE)
        table.move_cursor(row=PAGE - 1)
        await pilot.press("down")
        assert view.page == 1 and table.get_row_at(table.cursor_row)[0] == f"r{PAGE:05d}"
        await pilot.press("up")
        assert view.page == 0 and table.get_row_at(table.cursor_row)[0] == f"r{PAGE - 1:05d}"
        assert "page 1/3" in text_of(view.query_one(".status"))


@pytest.mark.asyncio
async def test_missing_run_ends_the_app_with_the_error(tmp_path):
    app = make_app(tmp_path / "nothing-here")
    async with app.run_test() as pilot:
        await pilot.pause()
    assert app.return_code == 1
    assert "nothing-here" in str(app.error)


def test_cli_missing_and_corrupt_runs_are_one_line(cli, runs, tmp_path):
    r = cli("tui", tmp_path / "missing")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("perfdiag: error:")
    assert "Traceback" not in r.stderr
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(runs[0], bad)
    (bad / "tables" / "steps.parquet").write_bytes(b"PAR1 this is not parquet")
    r = cli("tui", bad)
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert "steps.parquet" in r.stderr and "corrupt" in r.stderr
    (bad / "manifest.json").write_text("{not json")
    r = cli("tui", bad)
    assert r.returncode == 1 and r.stderr.count("\n") == 1


@pytest.mark.asyncio
async def test_overview_before_the_analysis_and_keys_meanwhile(runs, monkeypatch):
    """The identity shows at once with a progress bar; keys work while the worker runs;
    the findings appear when it is done."""
    import threading

    from perfdiag.tui.data import RunData

    gate = threading.Event()
    analyse = RunData.analyse

    def slow(self, progress=None):
        progress("serving analyses", 0.1)
        gate.wait(10)
        return analyse(self, progress)

    monkeypatch.setattr(RunData, "analyse", slow)
    app = make_app(load_run(runs[0]))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, OverviewScreen)
        assert app.screen.query("#identity") and app.screen.query("#progress")
        assert not app.screen.query("#findings")
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape", "3")  # a step screen waits for the analysis
        assert "analysing" in text_of(app.screen.query_one("#waiting"))
        gate.set()
        await settle(app, pilot)
        assert app.screen.query("#checks")  # … and fills in when it is done
        await pilot.press("escape")
        await settle(app, pilot)
        assert app.screen.query_one("#findings", DataTable).row_count == 6
        assert not app.screen.query("#progress")


@pytest.mark.asyncio
async def test_a_run_that_fails_while_analysed_ends_the_app(runs, monkeypatch):
    from perfdiag.errors import RunFormatError
    from perfdiag.tui.data import RunData

    def broken(self, progress=None):
        raise RunFormatError("tables/spans.parquet is corrupt or truncated (bad page)")

    monkeypatch.setattr(RunData, "analyse", broken)
    app = make_app(load_run(runs[0]))
    async with app.run_test() as pilot:
        await app.workers.wait_for_complete()
        await pilot.pause()
    assert app.return_code == 1 and "spans.parquet is corrupt" in str(app.error)


@pytest.mark.asyncio
async def test_mouse_opens_rows_and_sorts_by_header(runs):
    app = make_app(load_run(runs[0]))
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(app, pilot)
        # the second finding's row (header line, then rows): click to select, click to open
        await pilot.click("#findings", offset=(20, 2))
        await pilot.click("#findings", offset=(20, 2))
        await settle(app, pilot)
        assert isinstance(app.screen, FindingScreen) and app.screen.finding.rank == 2
        await pilot.press("escape", "r")
        await settle(app, pilot)
        view = app.screen.query_one(FrameView)
        await pilot.click(view.table, offset=(60, 0))  # a header: sort by that column
        await pilot.pause()
        assert view.sort_key != "ttft_ms" and view.descending


@pytest.mark.asyncio
async def test_an_unexpected_error_ends_the_app_for_the_cli_to_report(runs, monkeypatch):
    """Not Textual's full-screen traceback with exit code 0: the app ends with code 1 and
    keeps the error, which `perfdiag tui` reports in one line (exit 70)."""

    def broken(self) -> None:
        raise RuntimeError("a bug in a screen")

    monkeypatch.setattr(HelpScreen, "compose", broken)
    app = make_app(load_run(runs[0]), ceilings_dir=runs[0] / "none")
    with pytest.raises(RuntimeError, match="a bug in a screen"):
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(app, pilot)
            await pilot.press("question_mark")
            await pilot.pause()
    assert isinstance(app.error, RuntimeError) and app.return_code == 1
