"""Screens as pictures (pytest-textual-snapshot), at the smallest supported terminal
(80×24) and a large one (160×48). Deterministic: the demo runs have fixed times and a
pinned manifest, they are opened by a relative path from their directory, the roofline
uses the datasheet ceilings (no measured ones), and nothing on screen reads a clock.

Update after an intended change: pytest tests/test_tui_snapshots.py --snapshot-update
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tui_runs

from perfdiag import load_run
from perfdiag.tui.app import make_app

SMALL, LARGE = (80, 24), (160, 48)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    base = tmp_path_factory.mktemp("snap")
    tui_runs.demo(base / "demo-a")
    tui_runs.demo(base / "demo-b", chunk=48, flip="req-05", run_id="demo-b")
    return base


@pytest.fixture
def app(base, monkeypatch):
    monkeypatch.chdir(base)

    def build(*names: str):
        runs = [load_run(name) for name in names]  # relative: the same path on every machine
        return make_app(runs, ceilings_dir=Path("no-measured-ceilings"))

    return build


async def settled(pilot) -> None:
    for _ in range(3):
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()


def test_overview_small(app, snap_compare):
    assert snap_compare(app("demo-a"), terminal_size=SMALL, run_before=settled)


def test_overview_large(app, snap_compare):
    assert snap_compare(app("demo-a"), terminal_size=LARGE, run_before=settled)


async def _to_finding(pilot) -> None:
    await settled(pilot)
    await pilot.press("down", "down", "enter")
    await settled(pilot)


def test_finding_small(app, snap_compare):
    assert snap_compare(app("demo-a"), terminal_size=SMALL, run_before=_to_finding)


async def _to_request(pilot) -> None:
    await _to_finding(pilot)
    await pilot.press("enter")
    await settled(pilot)


def test_request_small(app, snap_compare):
    assert snap_compare(app("demo-a"), terminal_size=SMALL, run_before=_to_request)


def test_request_large(app, snap_compare):
    assert snap_compare(app("demo-a"), terminal_size=LARGE, run_before=_to_request)


def _keys(*keys: str):
    async def run(pilot) -> None:
        await settled(pilot)
        for key in keys:
            await pilot.press(key)
            await settled(pilot)

    return run


@pytest.mark.parametrize("key", ["2", "3", "4", "y"])
def test_step_screens_large(app, snap_compare, key):
    assert snap_compare(app("demo-a"), terminal_size=LARGE, run_before=_keys(key))


def test_requests_table_small(app, snap_compare):
    assert snap_compare(app("demo-a"), terminal_size=SMALL, run_before=_keys("r"))


def test_compare_large(app, snap_compare):
    assert snap_compare(app("demo-a", "demo-b"), terminal_size=LARGE, run_before=_keys("c"))
