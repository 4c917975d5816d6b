"""`perfdiag export` as a user runs it: the three formats, and bad input as one line on
stderr with exit code 1 (never a traceback, never a half-written file)."""

import json
from pathlib import Path

import export_runs as R
import pytest


@pytest.fixture(scope="module")
def rich(tmp_path_factory):
    return R.write_rich_run(tmp_path_factory.mktemp("cli") / "run")


def one_line_error(result, *fragments):
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("perfdiag: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_perfetto_by_default_into_the_run(cli, rich):
    result = cli("export", rich, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    path = Path(summary["path"])
    assert summary["format"] == "perfetto" and path.parent == rich / "exports"
    assert path.suffix == ".pftrace" and path.stat().st_size == summary["bytes"]
    assert summary["slices"]["kernel"] == 4 and summary["instants"] == 4
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp left


def test_chrome_and_tensorboard_with_out(cli, rich, tmp_path):
    result = cli("export", rich, "-f", "chrome", "-o", tmp_path / "sub" / "t.json.gz")
    assert result.returncode == 0, result.stderr
    assert "chrome://tracing" in result.stdout and (tmp_path / "sub" / "t.json.gz").exists()
    result = cli("export", rich, "--format", "tensorboard", "--out", tmp_path / "logs")
    assert result.returncode == 0, result.stderr
    assert "tensorboard --logdir" in result.stdout
    assert list((tmp_path / "logs").glob("*/*.pt.trace.json"))


def test_missing_run(cli, tmp_path):
    one_line_error(cli("export", tmp_path / "nope"), "no such directory")


def test_unknown_format(cli, rich):
    one_line_error(cli("export", rich, "--format", "svg"), "unknown format 'svg'", "perfetto")


def test_unwritable_out(cli, rich, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where a folder should be: fails even for root
    one_line_error(cli("export", rich, "-o", blocker / "t.pftrace"), "cannot write")
    one_line_error(cli("export", rich, "-f", "chrome", "-o", tmp_path), "is a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_tensorboard_without_a_profiler_window(cli, tmp_path):
    from perfdiag.traces.schema import Span
    from perfdiag.traces.writer import RunWriter

    with RunWriter(tmp_path / "run", command=["t"], environment_info={}) as w:
        w.table("spans").append(Span("forward", "phase", 10, 5, pid=1, tid=1))
    result = cli("export", tmp_path / "run", "-f", "tensorboard", "-o", tmp_path / "logs")
    one_line_error(result, "no profiler window", "--profile-steps")
