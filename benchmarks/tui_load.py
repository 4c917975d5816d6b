"""Benchmark the explorer on a large run: 100k requests and 1M spans (issue 8).

Target: the first screen in under 3 s, and scrolling that stays responsive. Measured in
Textual's headless driver (the same app and worker as `perfdiag tui`, no terminal I/O):

- first screen: from opening the run (load_run, as the CLI does) to the overview showing
  the run's identity; then the key metrics (serving analyses) and the findings (triage),
  which the background worker brings while the UI runs;
- responsiveness while the worker analyses: the lag of a 20 ms timer and the time a key
  press takes to be handled;
- the requests table (100k rows, paged): opening it, page-down and cursor moves, the last
  page, a sort and a filter.

The run is built as benchmarks/serving_analyzers.py builds it (not timed).

    .venv/bin/python benchmarks/tui_load.py [--requests 100000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _builder():
    spec = importlib.util.spec_from_file_location(
        "serving_analyzers", HERE / "serving_analyzers.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def machine() -> str:
    from perfdiag.traces.environment import cpu_model, package_version

    return (
        f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"textual {package_version('textual')}, pandas {package_version('pandas')}, "
        f"pyarrow {package_version('pyarrow')}"
    )


async def until(predicate, timeout: float = 120.0, step: float = 0.005) -> float:
    start = time.perf_counter()
    while not predicate():
        if time.perf_counter() - start > timeout:
            raise TimeoutError("the explorer did not get there")
        await asyncio.sleep(step)
    return time.perf_counter()


def import_time() -> float:
    """What `perfdiag tui` spends importing before it can draw (a fresh interpreter)."""
    import subprocess
    import sys

    code = (
        "import time; t = time.perf_counter(); import perfdiag.cli, perfdiag.tui.app, "
        "perfdiag.tui.screens.overview; print(time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout)


async def measure(path: Path) -> None:
    from perfdiag import load_run
    from perfdiag.tui.app import make_app
    from perfdiag.tui.screens.help import HelpScreen
    from perfdiag.tui.screens.overview import OverviewScreen
    from perfdiag.tui.screens.requests import RequestsScreen
    from perfdiag.tui.widgets.frame_table import FrameView

    t0 = time.perf_counter()
    run = load_run(path)
    app = make_app(run)
    async with app.run_test(size=(120, 40)) as pilot:

        def overview():
            s = app.screen
            return isinstance(s, OverviewScreen) and bool(s.query("#identity"))

        t_first = await until(overview)
        imports = import_time()
        print(
            f"first screen (identity, progress bar): {t_first - t0:.2f} s after opening the run, "
            f"{t_first - t0 + imports:.2f} s with the CLI's imports ({imports:.2f} s, fresh "
            "interpreter)   target < 3 s"
        )

        # while the worker analyses: a 20 ms timer's lag and key presses
        lags: list[float] = []
        expected = [time.perf_counter() + 0.02]

        def tick() -> None:
            now = time.perf_counter()
            lags.append(now - expected[0])
            expected[0] = now + 0.02

        timer = app.set_interval(0.02, tick)
        keys = []  # key → the screen it opens, while the worker runs (no pilot: it waits
        # for the whole process to go idle, which a busy worker never lets it)
        while app.data.serving is None and len(keys) < 20:
            k0 = time.perf_counter()
            app.simulate_key("question_mark")
            await until(lambda: isinstance(app.screen, HelpScreen), step=0.001)
            app.simulate_key("escape")
            await until(lambda: not isinstance(app.screen, HelpScreen), step=0.001)
            keys.append((time.perf_counter() - k0) / 2)
        t_metrics = await until(lambda: app.data.serving is not None)
        print(f"key metrics (serving analyses):        {t_metrics - t0:.2f} s")
        t_ready = await until(lambda: app.data.ready and bool(app.screen.query("#findings")))
        timer.stop()
        print(f"findings and triage steps:             {t_ready - t0:.2f} s")
        if lags:
            lags.sort()
            print(
                f"while analysing: 20 ms timer lag p50 {1e3 * statistics.median(lags):.0f} ms, "
                f"p99 {1e3 * lags[int(0.99 * (len(lags) - 1))]:.0f} ms, max {1e3 * lags[-1]:.0f} ms"
                f" ({len(lags)} ticks); key press handled in "
                f"{1e3 * statistics.median(keys):.0f} ms median, {1e3 * max(keys):.0f} ms max "
                f"({len(keys)} presses)"
            )

        for key in ("2", "3", "4", "5", "y", "t"):  # each screen, built and drawn

            def built() -> bool:
                s = app.screen
                return (
                    not isinstance(s, OverviewScreen) and s.is_mounted and not s.query("#waiting")
                )

            k = time.perf_counter()
            app.simulate_key(key)
            await until(built, timeout=300)
            await pilot.pause()
            print(
                f"screen {key!r} ready in {time.perf_counter() - k:.2f} s ({app.screen.name_text})"
            )
            app.simulate_key("escape")
            await until(lambda: isinstance(app.screen, OverviewScreen))
        k0 = time.perf_counter()
        await pilot.press("r")
        await until(
            lambda: isinstance(app.screen, RequestsScreen) and bool(app.screen.query(FrameView))
        )
        await pilot.pause()
        view = app.screen.query_one(FrameView)
        print(
            f"requests table ({len(view.frame):,} rows, sorted by TTFT): opened in "
            f"{time.perf_counter() - k0:.2f} s, {view.table.row_count} rows in the widget"
        )
        table = view.table

        def position():
            return (view.page, table.cursor_row)

        for key, n in (("pagedown", 60), ("down", 200), ("up", 50)):
            times = []
            for _ in range(n):
                before, k = position(), time.perf_counter()
                app.simulate_key(key)
                await until(lambda before=before: position() != before, step=0.0005)
                times.append(time.perf_counter() - k)
            await pilot.pause()  # and drawn
            times.sort()
            print(
                f"  {key:9s} ×{n}: handled in median {1e3 * statistics.median(times):.1f} ms, "
                f"p99 {1e3 * times[int(0.99 * (n - 1))]:.1f} ms, max {1e3 * times[-1]:.1f} ms "
                f"(now page {view.page + 1}/{view.pages}, row {table.cursor_row}, "
                f"{table.row_count} rows in the widget)"
            )
        for label in ("a request (enter)", "its first step (enter)"):
            k = time.perf_counter()
            app.simulate_key("enter")
            before = app.screen
            await until(lambda before=before: app.screen is not before and app.screen.is_mounted)
            await pilot.pause()
            print(f"  {label}: {1e3 * (time.perf_counter() - k):.0f} ms ({app.screen.name_text})")
        app.simulate_key("escape")
        app.simulate_key("escape")
        await until(lambda: isinstance(app.screen, RequestsScreen))
        await pilot.pause()
        for label, action in (
            ("end (last page)", lambda: pilot.press("end")),
            ("sort by another column", lambda: pilot.press("s")),
            ("filter ttft>3", lambda: _filter(app, view, "ttft>3")),
        ):
            k = time.perf_counter()
            await action()
            await pilot.pause()
            print(f"  {label}: {1e3 * (time.perf_counter() - k):.0f} ms ({view.status_text})")


async def _filter(app, view, text: str) -> None:
    view.filter_to(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--keep", type=Path, help="build the run here (reused when present)")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "run"
        if not (path / "manifest.json").exists():
            t = time.perf_counter()
            counts = _builder().build(path, args.requests)
            print(
                f"synthetic run built in {time.perf_counter() - t:.1f} s (not timed below): "
                + ", ".join(f"{k} {v:,}" for k, v in counts.items())
            )
        asyncio.run(measure(path))


if __name__ == "__main__":
    main()
