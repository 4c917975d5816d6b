"""The run format: round trips, dtypes, schema evolution and the writer's contract."""

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfdiag import load_run
from perfdiag.errors import ConfigError, RunFormatError
from perfdiag.traces.reader import conform
from perfdiag.traces.schema import ROW_TYPES, SCHEMAS, Span, Step
from perfdiag.traces.writer import RunWriter


def test_every_table_round_trips_exactly(sample_run):
    path, rows = sample_run
    run = load_run(path)
    assert run.status == "complete"
    assert run.missing_tables == []
    for table, written in rows.items():
        frame = run.table(table)
        assert len(frame) == len(written)
        for i, row in enumerate(written):
            for field, value in row._asdict().items():
                got = frame[field].iloc[i]
                if value is None:
                    assert pd.isna(got), (table, field)
                else:
                    assert got == value, (table, field, got, value)
                    if isinstance(value, int) and not isinstance(value, bool):
                        assert int(got) == value  # exact, never through float


def test_dtypes_are_stable_whatever_the_data(sample_run):
    run = load_run(sample_run[0])
    steps, spans = run.steps, run.spans
    assert steps["start_ns"].dtype == "int64"
    assert steps["gpu_time_ns"].dtype == "Int64"  # all null here, still an integer column
    assert spans["flops"].dtype == "Int64"
    assert isinstance(spans["category"].dtype, pd.CategoricalDtype)
    assert isinstance(run.requests["request_id"].dtype, pd.StringDtype)
    assert run.counters["value"].dtype == "float64"


def test_finished_run_is_compacted_to_parquet(sample_run):
    path, rows = sample_run
    files = sorted(p.name for p in (path / "tables").iterdir())
    assert files == sorted(f"{name}.parquet" for name in ROW_TYPES)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["tables"]["spans"] == {"format": "parquet", "rows": len(rows["spans"])}
    assert not (path / ".writer.lock").exists()


def test_manifest_pins_what_a_reproduction_needs(sample_run):
    m = load_run(sample_run[0]).manifest
    assert m.schema_version == 1 and m.perfdiag_version
    assert m.command == ["pytest"] and m.config == {"seed": 1}
    env = m.environment
    for key in ("python", "platform", "cpu_model", "packages", "git_revision"):
        assert key in env
    assert env["packages"]["pyarrow"] == pa.__version__
    # The clock origin maps the monotonic clock to wall time.
    assert m.wall_ns(m.clock["monotonic_ns"]) == m.clock["wall_ns"]
    assert m.ended_at is not None


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**63 - 1)),
        min_size=1,
        max_size=50,
    )
)
def test_any_int64_nanoseconds_survive(tmp_path_factory, values):
    path = tmp_path_factory.mktemp("prop") / "run"
    with RunWriter(path, batch_rows=7) as w:
        for start, dur in values:
            w.table("spans").append(Span("k", "kernel", start, dur))
    spans = load_run(path).spans
    assert spans["start_ns"].tolist() == [s for s, _ in values]
    assert spans["dur_ns"].tolist() == [d for _, d in values]


def test_batches_keep_append_order_across_flushes(tmp_path):
    with RunWriter(tmp_path / "run", batch_rows=10) as w:
        spans = w.table("spans")
        for i in range(1000):
            spans.append(Span("k", "kernel", i, 1))
            if i % 97 == 0:
                w.flush()
    assert load_run(tmp_path / "run").spans["start_ns"].tolist() == list(range(1000))


def test_malformed_rows_are_counted_never_silently_shifted(tmp_path):
    path = tmp_path / "run"
    with pytest.warns(UserWarning, match="dropped a malformed"), RunWriter(path) as w:
        spans = w.table("spans")
        spans.append(Span("good", "kernel", 1, 2))
        spans.append(("short", "kernel", 3))  # wrong width
        spans.append(Span("bad", "kernel", "not-a-time", 2))  # wrong type
        spans.append(Span(None, "kernel", 5, 6))  # null in a required column
        spans.append(Span("good2", "kernel", 7, 8))
    run = load_run(path)
    assert run.spans["name"].tolist() == ["good", "good2"]
    assert run.manifest.extra["dropped_records"] == {"spans": 3}


def test_interrupt_marks_the_run_interrupted_and_keeps_it(tmp_path):
    path = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt), RunWriter(path) as w:
        w.table("spans").append(Span("k", "kernel", 1, 1))
        raise KeyboardInterrupt
    run = load_run(path)
    assert run.status == "interrupted" and len(run.spans) == 1


def test_an_exception_marks_the_run_crashed_and_keeps_it(tmp_path):
    path = tmp_path / "run"
    with pytest.raises(RuntimeError), RunWriter(path) as w:
        w.table("steps").append(Step(0, 1, 2))
        raise RuntimeError("engine died")
    run = load_run(path)
    assert run.status == "crashed" and len(run.steps) == 1


def test_writer_refuses_to_overwrite_and_bad_settings(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("mine")
    with pytest.raises(ConfigError, match="already exists"):
        RunWriter(tmp_path / "taken")
    with pytest.raises(ConfigError, match="flush_interval_s"):
        RunWriter(tmp_path / "slow", flush_interval_s=5)
    with RunWriter(tmp_path / "ok") as w, pytest.raises(ConfigError, match="unknown table"):
        w.table("nope")


def test_update_manifest_while_running(tmp_path):
    path = tmp_path / "run"
    with RunWriter(path, config={"a": 1}) as w:
        w.update_manifest(config={"a": 1, "resolved": True})
        assert json.loads((path / "manifest.json").read_text())["config"]["resolved"]
        assert load_run(path).status == "running"  # the writer is alive and holds the lock
    assert load_run(path).manifest.config == {"a": 1, "resolved": True}


def test_older_table_without_a_later_nullable_column_reads(tmp_path):
    # An older writer knew no `rank` column: the reader fills it with nulls.
    old = SCHEMAS["steps"].remove(SCHEMAS["steps"].get_field_index("rank"))
    row = Step(0, 5, 9)._asdict()
    del row["rank"]
    table = pa.Table.from_pylist([row], schema=old)
    out = conform("steps", table)
    assert out.schema.names == SCHEMAS["steps"].names
    assert out["rank"].null_count == 1


def test_missing_required_column_is_an_error():
    table = pa.table({"step_id": [0], "start_ns": [1]})
    with pytest.raises(RunFormatError, match="required column end_ns"):
        conform("steps", table)


def test_foreign_extra_columns_are_kept():
    table = pa.table(
        {"name": ["k"], "category": ["kernel"], "start_ns": [1], "dur_ns": [2], "kineto_ext": ["x"]}
    )
    assert conform("spans", table).column_names[-1] == "kineto_ext"


def test_absent_tables_read_as_empty_and_are_listed(sample_run):
    path, _ = sample_run
    (path / "tables" / "counters.parquet").unlink()
    run = load_run(path)
    assert run.missing_tables == ["counters"]
    assert len(run.counters) == 0 and list(run.counters.columns) == SCHEMAS["counters"].names


def test_parquet_written_with_int64_not_timestamps(sample_run):
    schema = pq.read_schema(sample_run[0] / "tables" / "steps.parquet")
    assert schema.field("start_ns").type == pa.int64()


def test_arrow_batches_keep_order_with_buffered_rows(tmp_path):
    from perfdiag.traces.writer import rows_to_batch

    with RunWriter(tmp_path / "run") as w:
        spans = w.table("spans")
        spans.append(Span("a", "kernel", 1, 1))
        spans.append_batch(rows_to_batch([Span("b", "kernel", 2, 1), Span("c", "kernel", 3, 1)],
                                         "spans"))  # fmt: skip
        spans.append(Span("d", "kernel", 4, 1))
    assert load_run(tmp_path / "run").spans["name"].tolist() == ["a", "b", "c", "d"]


def test_only_the_columns_asked_for_are_read(sample_run):
    run = load_run(sample_run[0])
    table = run.arrow("spans", ["start_ns", "dur_ns"])
    assert table.column_names == ["start_ns", "dur_ns"]
    assert run.row_counts()["spans"] == 2  # from the Parquet footer, no data read
