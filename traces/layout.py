"""Where things live inside a run directory."""

from __future__ import annotations

from pathlib import Path

TABLES_DIR = "tables"
RESULTS_DIR = "results"  # written by analysis: metrics.json, findings.json, report.md
RAW_DIR = "raw"  # foreign files kept beside the run (raw profiler traces)
LOCK_FILE = ".writer.lock"
STREAM_SUFFIX = ".arrows"  # Arrow IPC stream: appendable, readable after a crash
PARQUET_SUFFIX = ".parquet"  # the compacted form of a finished run


def stream_path(run_dir: Path, table: str) -> Path:
    return Path(run_dir) / TABLES_DIR / f"{table}{STREAM_SUFFIX}"


def parquet_path(run_dir: Path, table: str) -> Path:
    return Path(run_dir) / TABLES_DIR / f"{table}{PARQUET_SUFFIX}"
