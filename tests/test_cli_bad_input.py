"""Bad input to `perfdiag inspect`: one line on stderr, exit code 1, never a traceback."""

import json

import pytest

from perfdiag.traces.schema import SCHEMA_VERSION


def _assert_one_line_error(result, *fragments):
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("perfdiag: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


def test_missing_directory(cli, tmp_path):
    _assert_one_line_error(cli("inspect", tmp_path / "nope"), "no such directory")


def test_a_file_is_not_a_run(cli, tmp_path):
    (tmp_path / "f").write_text("x")
    _assert_one_line_error(cli("inspect", tmp_path / "f"), "not a directory")


def test_missing_manifest(cli, tmp_path):
    _assert_one_line_error(cli("inspect", tmp_path), "not a run")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"schema_version": 1}', "missing required field"),
    ],
)
def test_corrupt_manifest(cli, tmp_path, text, fragment):
    (tmp_path / "manifest.json").write_text(text)
    _assert_one_line_error(cli("inspect", tmp_path), "manifest.json", fragment)


def test_manifest_with_wrong_types(cli, sample_run):
    path, _ = sample_run
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["clock"]["wall_ns"] = 1.5
    (path / "manifest.json").write_text(json.dumps(manifest))
    _assert_one_line_error(cli("inspect", path), "clock.wall_ns")


def test_truncated_parquet(cli, sample_run):
    path, _ = sample_run
    table = path / "tables" / "spans.parquet"
    table.write_bytes(table.read_bytes()[:-40])
    _assert_one_line_error(cli("inspect", path), "spans.parquet", "corrupt or truncated")


def test_newer_schema_version_is_refused(cli, sample_run):
    path, _ = sample_run
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["schema_version"] = SCHEMA_VERSION + 1
    manifest["perfdiag_version"] = "9.0.0"
    (path / "manifest.json").write_text(json.dumps(manifest))
    _assert_one_line_error(cli("inspect", path), "schema version", "upgrade perfdiag")


def test_inspect_a_good_run(cli, sample_run):
    path, rows = sample_run
    result = cli("inspect", path, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["status"] == "complete"
    assert summary["rows"] == {name: len(r) for name, r in rows.items()}
    assert summary["duration_ns"] == 1_000_000_001  # first step start → last step end
    human = cli("inspect", path)
    assert human.returncode == 0 and "complete" in human.stdout and "spans" in human.stdout


def test_tui_refuses_a_missing_ceilings_dir(cli, sample_run, tmp_path):
    # As timeline does: a typo in --ceilings-dir must not silently judge the roofline
    # against the datasheet instead of the measured ceilings.
    missing = tmp_path / "no-such-ceilings"
    _assert_one_line_error(cli("tui", sample_run, "--ceilings-dir", missing), "--ceilings-dir")
