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
    monkeypatch.setattr(out, "_width", 80)  # restored to None: the width stays dynamic
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


@pytest.mark.parametrize(
    "args",
    [("inspect", "{a}"), ("analyze", "{a}", "--no-report"), ("doctor",),
     ("timeline", "{b}", "--top", "30"), ("compare", "{b}", "{a}")],
)  # fmt: skip
def test_other_commands_at_80_columns(runs, monkeypatch, args):
    a, b = runs
    assert_fits(at_80(monkeypatch, *(x.format(a=a, b=b) for x in args)))


def test_run_summary_at_80_columns(tmp_path):
    cmd = [sys.executable, "-m", "perfdiag", "run", *TINY, "--out", str(tmp_path / "r")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                            env={**__import__("os").environ, "COLUMNS": "80"})  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "TTFT p50 / p99" in result.stdout
    assert_fits(result.stdout)


def test_sweep_and_capacity_results_at_80_columns(monkeypatch):
    from perfdiag.cli.capacity import print_capacity
    from perfdiag.cli.sweep import print_result
    from perfdiag.sweeps.capacity import Sample, search
    from perfdiag.sweeps.runner import SweepResult
    from perfdiag.sweeps.spec import from_command_line

    monkeypatch.setattr(out, "_width", 80)  # restored to None: the width stays dynamic
    spec = from_command_line(["preset=tiny"], ["chunk-size=32,off"], 2, "ttft=0.5", None, None)
    import pandas as pd

    table = pd.DataFrame({"chunk_size": [32, None], "repeats": 2, "ttft_p99_ms": [1761.83, 624.0],
                          "itl_p99_ms": [52.71, 88.42], "output_tok_s": [78.2, 80.7],
                          "attainment": [0.95, 1.0],
                          "cause": ["chunk-too-small", "itl-prefill-interference"]})  # fmt: skip
    with out.capture() as captured:
        print_result(spec, SweepResult(__import__("pathlib").Path("sweeps/x"), table, [], [], True))

        def measure(x, repeat):
            good = 200 if x < 7 else 150
            return Sample(200, good, "runs/r", "queue-dominates-ttft", "Queue wait is 80% of TTFT")

        result = search(measure, 10.0)
        print_capacity(result, None, "rate", "req/s", __import__("pathlib").Path("cap"))
    text = captured.get()
    assert "itl-prefill-interference" in text and "capacity:" in text
    assert_fits(text)
