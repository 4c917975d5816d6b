"""The importer's fast front end (native decoding, batch cuts, column-wise rows) gives the
exact front end's rows, in the same order, with the same counts — on every shared real
trace and on mutated ones — or refuses the file (FastReadFailed) so that the caller reads
it exactly."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fuzz_kineto import ARG_FIELDS, BASE, FIELDS, mutate, nasty

import perfdiag
from perfdiag.traces.importers import chrome_stream
from perfdiag.traces.importers.kineto import import_kineto
from perfdiag.traces.importers.kineto_events import FastReadFailed, KinetoFileReader

KINETO = Path(__file__).resolve().parent / "data" / "kineto"  # real traces, as in conftest.py
REAL = sorted(KINETO.glob("*.json.gz"))
COLUMNS = ("name", "category", "start_ns", "dur_ns", "pid", "tid", "device", "stream", "rank",
           "step_id", "correlation", "flops", "bytes", "args")  # fmt: skip


def _read(path: Path, fast: bool):
    """Everything a reader hands on, in order (batches as their rows), and its counts."""
    out, counters = [], []

    def batch(b):
        out.extend(tuple(row[c] for c in COLUMNS) for row in b.to_pylist())

    reader = KinetoFileReader(path, out.append, counters.append, rank_of=lambda h: 3,
                              time_offset_ns=7, add_spans=batch)  # fmt: skip
    reader.read(fast=fast)
    s = reader.stream
    counts = (reader.spans_by_category, reader.skipped, reader.processes, reader.threads,
              reader.profiler_windows, reader.flows_linked, reader.unresolved, s.header,
              s.events_seen)  # fmt: skip
    return reader.front_end, out, counters, counts


def _same(path: Path) -> bool:
    """True when the fast front end read the file (and matched); False when it refused."""
    try:
        front_end, rows, counters, counts = _read(path, fast=True)
    except FastReadFailed:
        return False
    _, exact_rows, exact_counters, exact_counts = _read(path, fast=False)
    assert front_end == "fast"
    assert len(rows) == len(exact_rows)
    for i, (a, b) in enumerate(zip(rows, exact_rows, strict=True)):
        assert a == b, f"row {i}"
    assert counters == exact_counters
    assert counts == exact_counts
    return True


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_real_traces_read_the_same(path):
    with mock.patch.object(chrome_stream, "BATCH_CHARS", 1 << 16):  # many batch cuts
        assert _same(path)


def test_cuts_inside_strings_and_args_are_retried(tmp_path):
    # Every name and args holds the boundary patterns the batch cutter searches for.
    events = [
        {"ph": "X", "cat": "cpu_op", "name": f"op}}, {{{i}}}]", "pid": 1, "tid": 1,
         "ts": 1000 + i, "dur": 1, "args": {"k": [{"a": 1}, {"b": "}, {"}], "flops": i}}
        for i in range(3000)
    ]  # fmt: skip
    path = tmp_path / "fooled.json"
    path.write_text(json.dumps({"traceEvents": events, "after": [{"x": 1}, {"y": 2}]}))
    with mock.patch.object(chrome_stream, "BATCH_CHARS", 2048):
        assert _same(path)


def test_what_msgspec_refuses_is_read_exactly(tmp_path):
    doc = json.loads(json.dumps(BASE))
    doc["traceEvents"][0]["args"]["weird"] = float("nan")  # a NaN literal
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(doc, allow_nan=True))
    with pytest.raises(FastReadFailed):
        _read(path, fast=True)
    import_kineto([path], tmp_path / "run")
    meta = perfdiag.load_run(tmp_path / "run").manifest.extra["kineto"]["files"][0]
    assert meta["front_end"] == "exact"
    assert meta["events"] == len(doc["traceEvents"])


def test_a_real_trace_is_imported_by_the_fast_front_end(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(BASE))
    import_kineto([path], tmp_path / "run")
    meta = perfdiag.load_run(tmp_path / "run").manifest.extra["kineto"]["files"][0]
    assert meta["front_end"] == "fast"


@settings(max_examples=150, deadline=None)
@given(
    mutations=st.lists(
        st.tuples(
            st.integers(0, len(BASE["traceEvents"]) - 1),
            st.sampled_from(FIELDS + [f"args.{a}" for a in [*ARG_FIELDS, "Input Dims"]]),
            nasty,
            st.booleans(),
        ),
        min_size=1,
        max_size=4,
    ),
    copies=st.integers(1, 40),
)
def test_mutated_traces_read_the_same(tmp_path_factory, mutations, copies):
    doc = json.loads(json.dumps(BASE))
    for index, field, value, delete in mutations:
        mutate(doc["traceEvents"][index], field, value, delete)
    doc["traceEvents"] = doc["traceEvents"] * copies  # several batches
    path = tmp_path_factory.mktemp("fast") / "t.json"
    path.write_text(json.dumps(doc, allow_nan=True))
    with mock.patch.object(chrome_stream, "BATCH_CHARS", 4096):
        _same(path)
