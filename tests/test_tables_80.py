"""At 80 columns every table of `perfdiag timeline`, `perfdiag compare` and `perfdiag
analyze --details` fits, and no cell is cut: a number keeps all its digits, text wraps
or folds, and a column that does not fit is left out and named (cli/fit.py)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from perfdiag.cli import app as cli_app
from perfdiag.cli.app import out
from perfdiag.cli.fit import fit

TINY = ("--preset", "tiny", "--prompt-len", "uniform:8:64", "--output-len", "uniform:4:12",
        "--no-device-sampling", "-q", "-n", "24", "--rate", "50")  # fmt: skip
CUT = re.compile(r"\S…")  # rich's ellipsis right after what it cut (a literal "…" stands apart)


def record(out_dir, *args):
    cmd = [sys.executable, "-m", "perfdiag", "run", *TINY, *args, "--out", str(out_dir)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    return out_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("eighty")
    a = record(base / "a", "--profile-steps", "3:6")  # CPU ops with long names
    b = record(base / "b", "--chunk-size", "16")
    return a, b


def at_80(monkeypatch, *args) -> str:
    monkeypatch.setattr(out, "width", 80)
    result = CliRunner().invoke(cli_app, [*map(str, args)], terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.stdout


def assert_fits(text: str) -> None:
    for line in text.splitlines():
        assert len(line) <= 80, line
        assert not CUT.search(line), f"a cell was cut: {line!r}"


def test_timeline_at_80_columns(runs, monkeypatch):
    text = at_80(monkeypatch, "timeline", runs[0])
    assert "step-time breakdown" in text and "CPU ops" in text
    assert_fits(text)


def test_compare_at_80_columns(runs, monkeypatch):
    text = at_80(monkeypatch, "compare", *runs)
    assert "interval" in text and "verdict" in text and "TTFT p50" in text
    assert_fits(text)


def test_analyze_details_at_80_columns(runs, monkeypatch):
    text = at_80(monkeypatch, "analyze", runs[0], "--details")
    assert "latency" in text and "Triage steps" in text
    assert_fits(text)


def test_fit_leaves_out_columns_rather_than_cut_a_number():
    console = Console(width=80, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    t = Table("name", *[f"column {i}" for i in range(9)], title="wide")
    t.add_row(
        "a fairly long kernel name that must wrap", *[f"{12345.678 * i:,.3f}" for i in range(9)]
    )
    console.print(fit(t, console, drop=["column 3"]))
    text = console.export_text()
    assert_fits(text)
    assert "74,074.068" in text and "12,345.678" in text  # kept numbers are whole
    # the empty column first, then the one asked for, then from the right
    assert "not shown at 80 columns: column 0, column 3, column 8, column 7" in text
