"""A finished run that lost a Parquet file, or all of tables/, after it closed: the
manifest's row counts make the loss visible, so loading says so (a warning, `inspect`, the
data-trust step of `analyze`) instead of reading it as a complete run with empty tables,
and `report` still writes its page."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fuzz_support import assert_clean, call_cli

from perfdiag import load_run
from perfdiag.traces.layout import TABLES_DIR, parquet_path


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    from perfdiag.probes.run_options import EngineOptions, ProbeOptions, RunOptions
    from perfdiag.probes.session import record_run
    from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec

    workload = WorkloadSpec(requests=8, warmup=0, arrival=ArrivalSpec(mode="open", rate=40.0),
                            prompt_len=LengthSpec(value=16),
                            output_len=LengthSpec(value=4))  # fmt: skip
    options = RunOptions(EngineOptions(preset="tiny", kv_cache_mb=4), workload,
                         ProbeOptions(device_sampling=False))  # fmt: skip
    path = tmp_path_factory.mktemp("lost") / "run"
    record_run(options, path, command=["pytest"])
    return path


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("table", ["requests", "steps", "spans"])
def test_a_deleted_parquet_file_is_reported_as_lost(finished, tmp_path, table):
    path = _copy(finished, tmp_path / "run")
    expected = load_run(finished).row_counts()[table]
    assert expected > 0
    parquet_path(path, table).unlink()
    run = load_run(path)
    assert run.lost_tables == {table: expected}
    assert any(f"{table}: tables/{table}.parquet is missing" in w for w in run.warnings)
    assert f"{expected:,} rows" in " ".join(run.warnings)
    inspected = call_cli("inspect", path)
    assert_clean(inspected, allowed=(0,))
    assert "missing" in inspected.stdout and table in inspected.stdout
    analyzed = call_cli("analyze", path, "--no-report")
    assert_clean(analyzed, allowed=(0,))
    assert "no data or reproducibility problem" not in analyzed.stdout
    assert "lost" in analyzed.stdout
    reported = call_cli("report", path, "-o", tmp_path / "r.html")  # steps lost: no roofline
    assert_clean(reported, allowed=(0,))


def test_all_of_tables_deleted(finished, tmp_path):
    path = _copy(finished, tmp_path / "run")
    shutil.rmtree(path / TABLES_DIR)
    run = load_run(path)
    assert set(run.lost_tables) >= {"requests", "steps", "spans"}
    analyzed = call_cli("analyze", path, "--no-report")
    assert_clean(analyzed, allowed=(0,))
    assert "lost" in analyzed.stdout
    reported = call_cli("report", path, "-o", tmp_path / "r.html")
    assert_clean(reported, allowed=(0,))
    assert (tmp_path / "r.html").stat().st_size > 0


def test_an_intact_run_has_no_loss(finished):
    run = load_run(finished)
    assert run.lost_tables == {} and not run.warnings
