"""Damaged runs: flipped bytes and truncation in a crashed run's Arrow streams and in a
finished run's Parquet files, and mutated manifest fields. Every command either works on
what can be trusted or says in one line what is wrong: no traceback, and no value read
that differs from what was recorded (a damaged stream yields a prefix of its rows)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fuzz_support import assert_clean, call_cli
from hypothesis import given
from hypothesis import strategies as st

from perfdiag import load_run
from perfdiag.errors import PerfdiagError
from perfdiag.traces.layout import parquet_path, stream_path
from perfdiag.traces.schema import ROW_TYPES

TO_STREAMS = textwrap.dedent(
    """
    import os, signal, sys
    from perfdiag import load_run
    from perfdiag.traces.writer import RunWriter
    src = load_run(sys.argv[1])
    m = src.manifest
    w = RunWriter(sys.argv[2], command=m.command, config=m.config, environment_info=m.environment)
    for name in src.sources:
        table = src.arrow(name)
        for batch in table.to_batches(max_chunksize=40):
            w.table(name).append_batch(batch)
    w.flush()
    os.kill(os.getpid(), signal.SIGKILL)  # a crash: the streams stay, the manifest says running
    """
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A small complete run (Parquet) and the same rows as a crashed run (streams)."""
    from perfdiag.probes.run_options import EngineOptions, ProbeOptions, RunOptions
    from perfdiag.probes.session import record_run
    from perfdiag.probes.workload import ArrivalSpec, LengthSpec, WorkloadSpec

    base = tmp_path_factory.mktemp("fuzz-runs")
    workload = WorkloadSpec(requests=12, warmup=2, arrival=ArrivalSpec(mode="open", rate=40.0),
                            prompt_len=LengthSpec.parse("uniform:8:40"),
                            output_len=LengthSpec.parse("uniform:2:8"))  # fmt: skip
    options = RunOptions(EngineOptions(preset="tiny", kv_cache_mb=4, chunk_size=16), workload,
                         ProbeOptions(device_sampling=False, profile_steps=(2, 3)))  # fmt: skip
    complete = base / "complete"
    record_run(options, complete, command=["pytest"])
    crashed = base / "crashed"
    done = subprocess.run([sys.executable, "-c", TO_STREAMS, str(complete), str(crashed)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == -9, done.stderr
    originals = {}
    for path in (complete, crashed):
        run = load_run(path)
        originals[path] = {name: run.arrow(name) for name in ROW_TYPES}
    assert load_run(crashed).status == "crashed"
    return complete, crashed, originals


def _copy(src: Path, dst: Path) -> Path:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


def _flip(path: Path, positions: list[float], masks: list[int]) -> None:
    data = bytearray(path.read_bytes())
    if not data:
        return
    for where, mask in zip(positions, masks, strict=False):
        i = min(int(where * len(data)), len(data) - 1)
        data[i] ^= mask
    path.write_bytes(bytes(data))


def _assert_prefix_or_error(path: Path, original: dict) -> None:
    """What loads is exactly what was recorded (a prefix of each table), or an error."""
    try:
        run = load_run(path)
        tables = {name: run.arrow(name) for name in ROW_TYPES}
    except PerfdiagError:
        return
    for name, table in tables.items():
        recorded = original[name]
        assert table.num_rows <= recorded.num_rows, name
        assert _values(table) == _values(recorded.slice(0, table.num_rows)), f"{name} changed"


def _values(table) -> list[dict]:
    return table.to_pylist()  # values, whatever the encoding (dictionary or plain)


def _commands_stay_clean(path: Path, tmp: Path) -> None:
    for args in (
        ("inspect", path),
        ("timeline", path, "--json"),
        ("analyze", path, "--no-report"),
        ("export", path, "-f", "chrome", "-o", tmp / "out.json"),
    ):
        assert_clean(call_cli(*args))


flips = st.lists(st.floats(0, 1, exclude_max=True), min_size=1, max_size=4)
masks = st.lists(st.integers(1, 255), min_size=4, max_size=4)
tables = st.sampled_from(list(ROW_TYPES))


@given(table=tables, positions=flips, bits=masks)
def test_flipped_bytes_in_a_crashed_runs_stream(runs, tmp_path, table, positions, bits):
    _, crashed, originals = runs
    path = _copy(crashed, tmp_path / "run")
    _flip(stream_path(path, table), positions, bits)
    _assert_prefix_or_error(path, originals[crashed])
    _commands_stay_clean(path, tmp_path)


@given(table=tables, cut=st.floats(0, 1, exclude_max=True))
def test_a_crashed_runs_stream_cut_anywhere(runs, tmp_path, table, cut):
    _, crashed, originals = runs
    path = _copy(crashed, tmp_path / "run")
    stream = stream_path(path, table)
    data = stream.read_bytes()
    stream.write_bytes(data[: int(cut * len(data))])
    _assert_prefix_or_error(path, originals[crashed])
    _commands_stay_clean(path, tmp_path)


@given(table=tables, positions=flips, bits=masks)
def test_flipped_bytes_in_a_finished_runs_parquet(runs, tmp_path, table, positions, bits):
    complete, _, originals = runs
    path = _copy(complete, tmp_path / "run")
    _flip(parquet_path(path, table), positions, bits)
    try:  # a finished run is whole or an error: never a prefix
        run = load_run(path)
        for name in ROW_TYPES:
            assert _values(run.arrow(name)) == _values(originals[complete][name]), name
    except PerfdiagError:
        pass
    _commands_stay_clean(path, tmp_path)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=6,
)  # fmt: skip


def _paths(value, prefix=()):
    """Every path into a JSON value, the value itself included."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


@given(choice=st.integers(0, 10**9), value=json_values, delete=st.booleans())
def test_a_mutated_manifest_field(runs, tmp_path, choice, value, delete):
    complete, _, _ = runs
    path = _copy(complete, tmp_path / "run")
    manifest = json.loads((path / "manifest.json").read_text())
    # Fields inside config.run_options / environment.packages are where readers look.
    paths = [p for p in _paths(manifest) if p]
    where = paths[choice % len(paths)]
    parent = manifest
    for key in where[:-1]:
        parent = parent[key]
    if delete and isinstance(parent, dict):
        del parent[where[-1]]
    else:
        parent[where[-1]] = value
    (path / "manifest.json").write_text(json.dumps(manifest))
    _commands_stay_clean(path, tmp_path)
    assert_clean(call_cli("compare", complete, path))
